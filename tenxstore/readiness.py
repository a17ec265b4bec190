"""Whether a repository's database is ready: its schema migrated to head (at once, on
a private event loop, or on a connection the backend hands over at first use) and
its health as :meth:`~tenxstore.repository.CheckpointRepository.acheck` reports it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from datetime import timezone

from sqlalchemy import select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from . import migrate
from .crypto import KeyRing
from .errors import TenxStoreError
from .store import Store, keyless_refusal
from .types import Health

__all__ = ["health", "migrate_on", "setup", "setup_blocking"]


async def migrate_on(store: Store, connection: AsyncConnection) -> None:
    """Migrate the store's schema to head on ``connection``; the store is then ready."""
    await migrate.upgrade_connection(
        connection,
        schema=store.schema,
        id_type=store.settings.id_type,
        user_id_type=store.settings.user_id_type,
    )
    store.ready()


async def setup(store: Store) -> None:
    """Migrate the store's schema to head on connections of its backend. A schema at
    head already (every start of an application asks) costs one statement, and the
    store is then ready for its first call."""
    if await store.at_head():
        return
    await migrate.upgrade(
        store.backend,
        schema=store.schema,
        id_type=store.settings.id_type,
        user_id_type=store.settings.user_id_type,
    )
    store.ready()


async def _setup_on(store: Store, private: AsyncEngine) -> None:
    """Migrate on one connection of the backend's private setup engine, then dispose it."""
    backend = store.backend
    try:
        try:
            connection = await private.connect().start()
        except (DBAPIError, OSError, asyncio.TimeoutError) as exc:
            raise backend.opening_failed(exc) from exc
        try:
            if await store.at_head(connection):  # one statement: nothing to migrate
                return
            await backend.begin_write(connection)
            await migrate_on(store, connection)
        finally:
            await connection.close()
    finally:
        await private.dispose()


def setup_blocking(store: Store, asetup: Callable[[], Awaitable[None]]) -> None:
    """Run the migration to completion from sync code, on a private event loop (in a
    worker thread when the caller's thread already runs one).

    ``asetup`` is the repository's own (traced) setup, used when the database is the
    backend's one connection and has no private engine.
    """
    private = store.backend.setup_engine()

    async def run() -> None:
        if private is None:  # the database is the backend's one connection
            await asetup()
            return
        await _setup_on(store, private)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(run())
        return
    # Called from async code: run on a private loop in a worker thread.
    outcome: list[BaseException] = []

    def worker() -> None:
        try:
            asyncio.run(run())
        except BaseException as exc:  # re-raised in the caller's thread
            outcome.append(exc)

    thread = threading.Thread(target=worker, name="tenxstore-setup")
    thread.start()
    thread.join()
    if outcome:
        raise outcome[0]


async def health(store: Store, keys: KeyRing | None) -> Health:
    """The database's health: reachable, its schema's revision, its sealed marker and
    whether a write without ``keys`` would be refused. Never raises for what it finds."""
    head = migrate.head_revision()
    sealed = None
    try:
        async with store.backend.connect() as conn:
            revision, _ = await migrate.read_schema(conn, store.schema)
            if revision == head:  # the marker's column is there
                found = await conn.execute(select(store.tables.store.c.sealed_since))
                sealed = found.scalar()
    except TenxStoreError as exc:
        return Health(store.where(), str(exc), None, head)
    except DBAPIError as exc:
        return Health(store.where(), f"{type(exc.orig).__name__}: {exc.orig}", None, head)
    since = None if sealed is None else sealed.replace(tzinfo=sealed.tzinfo or timezone.utc)
    refused = keyless_refusal(store.where(), since) if keys is None else None
    replicas = store.backend.replicas
    return Health(
        store.where(),
        None,
        revision,
        head,
        sealed_since=since,
        encryption_error=None if refused is None else str(refused),
        replicas=() if replicas is None else await replicas.health(),
    )
