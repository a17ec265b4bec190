"""LangGraph's ``TTLConfig`` for :class:`~tenxstore.langgraph.TenxStore`, and its sweeper.

TTLs are in minutes, as LangGraph has them. An expired item is never returned, swept
or not (LangGraph's ``omit_expired=True``): the sweep only frees its rows, and is the
memory store's (:meth:`~tenxstore.MemoryStore.asweep_expired`: every user's expired
memories, in short batches). ``start_ttl_sweeper`` / ``stop_ttl_sweeper`` are
LangGraph's PostgreSQL store's: a daemon thread sweeping every
``sweep_interval_minutes`` (5 unless told).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from langgraph.store.base import TTLConfig

from ..errors import ConfigError
from ..memory.sync import blocking as run_blocking
from .items import check_ttl_minutes

if TYPE_CHECKING:
    from ..memory.mem0 import Mem0Store
    from ..memory.store import MemoryStore

__all__ = ["TTLSweeper", "check_ttl_config"]

log = logging.getLogger(__name__)
_KEYS = ("default_ttl", "refresh_on_read", "sweep_interval_minutes", "omit_expired")


def check_ttl_config(ttl: object) -> TTLConfig | None:
    """A ``TTLConfig``, checked (a copy).

    Raises:
        ConfigError: An unknown key, a TTL or interval that is not a positive number,
            a ``refresh_on_read`` that is not a bool, or ``omit_expired=False`` (an
            expired memory is never returned).
    """
    if ttl is None:
        return None
    if not isinstance(ttl, Mapping):
        raise ConfigError(f"ttl must be a TTLConfig dict, not {type(ttl).__name__}")
    unknown = sorted(set(ttl) - set(_KEYS))
    if unknown:
        raise ConfigError(f"ttl: unknown keys {unknown} (TTLConfig has {', '.join(_KEYS)})")
    check_ttl_minutes(ttl.get("default_ttl"), "ttl['default_ttl']")
    check_ttl_minutes(ttl.get("sweep_interval_minutes"), "ttl['sweep_interval_minutes']")
    if not isinstance(ttl.get("refresh_on_read", True), bool):
        raise ConfigError("ttl['refresh_on_read'] must be a bool")
    if ttl.get("omit_expired", True) is not True:
        raise ConfigError(
            "ttl['omit_expired'] can only be True: an expired memory is never returned, "
            "swept or not"
        )
    return cast(TTLConfig, dict(ttl))


class TTLSweeper:
    """The sweep of expired items, once or every few minutes in a thread."""

    memory_store: MemoryStore | Mem0Store
    ttl_config: TTLConfig | None

    def __init__(self) -> None:
        self._sweeper: threading.Thread | None = None
        self._stop = threading.Event()

    async def asweep_ttl(self) -> int:
        """Delete the expired memories now (every user's: they are gone already); how
        many."""
        return await self.memory_store.asweep_expired()

    def sweep_ttl(self) -> int:
        """Synchronous :meth:`asweep_ttl`."""
        return run_blocking(self.asweep_ttl(), "asweep_ttl")

    def start_ttl_sweeper(
        self, sweep_interval_minutes: float | None = None
    ) -> concurrent.futures.Future[None]:
        """Sweep every ``sweep_interval_minutes`` (else the TTL config's, else 5) in a
        daemon thread until :meth:`stop_ttl_sweeper` or the future is cancelled; a
        failed sweep is logged and the next one runs. Without a TTL config, nothing
        runs (the future is done), as in LangGraph's stores.

        Raises:
            ConfigError: The memories are a ``Mem0Store``'s, which cannot sweep (they
                are hidden once expired all the same): a sweeper would fail forever.
        """
        from ..memory.mem0 import Mem0Store

        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        if not self.ttl_config:
            future.set_result(None)
            return future
        if isinstance(self.memory_store, Mem0Store):
            raise ConfigError(
                "a TenxStore over a Mem0Store has no TTL sweeper: Mem0 lists one user's "
                "memories at a time; expired ones are never returned all the same"
            )
        future.add_done_callback(lambda f: self._stop.set() if f.cancelled() else None)
        if self._sweeper is not None and self._sweeper.is_alive():
            return future  # one sweeper per store: this future can stop it
        given = sweep_interval_minutes or self.ttl_config.get("sweep_interval_minutes")
        minutes = check_ttl_minutes(given or 5, "sweep_interval_minutes")
        assert minutes is not None
        self._stop.clear()

        def sweep() -> None:
            while not self._stop.wait(minutes * 60):
                try:
                    swept = self.sweep_ttl()
                    if swept:
                        log.info("swept %d expired memories", swept)
                except Exception:  # the next sweep may work: a sweeper never dies of one
                    log.exception("a sweep of expired memories failed")
            if not future.done():
                future.set_result(None)

        self._sweeper = threading.Thread(target=sweep, daemon=True, name="tenxstore-ttl-sweeper")
        self._sweeper.start()
        return future

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper thread; whether it stopped within ``timeout`` seconds (True
        when none was running)."""
        thread = self._sweeper
        if thread is None or not thread.is_alive():
            return True
        self._stop.set()
        thread.join(timeout)
        if thread.is_alive():
            return False
        self._sweeper = None
        return True
