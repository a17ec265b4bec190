"""An ``AsyncEngine`` that borrows its connections from a caller's asyncpg ``Pool``.

SQLAlchemy opens a connection per checkout (``NullPool``) through an
``async_creator`` that acquires one from the pool; closing it releases it back.
Each transaction therefore borrows a connection and returns it. SQLAlchemy's
per-connection setup (type codecs) runs on every borrow, so an ``AsyncEngine`` of
your own is the faster choice when you have one.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from ..errors import ConfigError

__all__ = ["engine_from_asyncpg_pool"]


class _Borrowed:
    """An asyncpg connection on loan: ``close()`` gives it back to its pool."""

    __slots__ = ("_con", "_pool", "_returned")

    def __init__(self, pool: Any, con: Any) -> None:
        self._pool, self._con, self._returned = pool, con, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)

    def is_closed(self) -> bool:
        return self._returned or bool(self._con.is_closed())

    async def close(self, *, timeout: float | None = None) -> None:
        if not self._returned:
            self._returned = True
            await self._pool.release(self._con, timeout=timeout)

    def terminate(self) -> None:
        # A broken connection: asyncpg's pool replaces a terminated one on release.
        self._con.terminate()


def engine_from_asyncpg_pool(pool: Any, **options: Any) -> AsyncEngine:
    """An engine whose every connection is borrowed from ``pool`` and then returned."""
    try:
        import asyncpg
    except ImportError as exc:  # pragma: no cover - asyncpg is a dependency
        raise ConfigError("asyncpg is required for pg_pool") from exc
    if not isinstance(pool, asyncpg.Pool):
        raise ConfigError(
            f"pg_pool must be an AsyncEngine or an asyncpg Pool, not {type(pool).__name__}"
        )

    async def borrow() -> Any:
        owner = getattr(pool, "_loop", None)  # asyncpg keeps the loop it was created on
        if owner is not None and owner is not asyncio.get_running_loop():
            raise ConfigError(
                "pg_pool is an asyncpg pool of another event loop"
                + (" (now closed)" if owner.is_closed() else "")
                + ": create the pool on the loop that uses the checkpointer, or pass a DSN"
            )
        return _Borrowed(pool, await pool.acquire())

    engine = create_async_engine(
        "postgresql+asyncpg://", async_creator=borrow, poolclass=NullPool, **options
    )
    engine.sync_engine._tenxstore_borrowed = True  # type: ignore[attr-defined]  # setup() reads it
    return engine
