"""PostgreSQL behind a transaction-pooling PgBouncer (:class:`PgBouncerBackend`).

A statement outside a transaction may be parsed and executed on different server
connections, and a session setting lands on whichever server connection serves it:
no statement caches, unique prepared-statement names, every statement inside a
transaction, and ``SET LOCAL lock_timeout`` in each write transaction.
"""

from __future__ import annotations

import uuid
from contextlib import AbstractAsyncContextManager
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import Executable

from .asyncpg_driver import asyncpg_error
from .base import timeout_ms
from .postgres import PostgresBackend

__all__ = ["PgBouncerBackend", "transaction_pooling_args"]


def _statement_name() -> str:
    return f"__tenx_{uuid.uuid4().hex}__"


def transaction_pooling_args() -> dict[str, Any]:
    """asyncpg connect arguments for a transaction-pooling PgBouncer.

    A transaction pooler hands each transaction to any server connection, so a
    statement prepared in one transaction cannot be found in the next: no statement
    cache (asyncpg's or SQLAlchemy's), and a unique name for every statement
    SQLAlchemy prepares, so two clients never collide on one server connection. Pass
    them as ``connect_args`` to an engine of your own.
    """
    return {
        "statement_cache_size": 0,
        "prepared_statement_cache_size": 0,
        "prepared_statement_name_func": _statement_name,
    }


class PgBouncerBackend(PostgresBackend):
    """PostgreSQL behind a transaction-pooling PgBouncer (``pool_mode="transaction"``).

    No driver-level hot path: without prepared-statement caches a statement outside a
    transaction is parsed and executed in two exchanges, which the pooler may send to
    two server connections; every statement runs in a transaction instead.
    """

    name = "pgbouncer"
    driver_hot_path = False

    @classmethod
    def connect_args(cls, lock_timeout: float | None) -> dict[str, Any]:
        return transaction_pooling_args()

    @classmethod
    def prepare(cls, engine: AsyncEngine, lock_timeout: float | None) -> None:
        """Nothing per connection: a session setting would land on any server connection."""

    def read_options(self) -> dict[str, Any]:
        # A transaction pins a statement's Parse and Bind to one server connection.
        return {}

    def write(
        self, lock: Executable, params: dict[str, Any]
    ) -> AbstractAsyncContextManager[tuple[AsyncConnection, Any]]:
        # asyncpg's own BEGIN is a simple query: the pooler sees the transaction start.
        return self._block_write(lock, params)

    async def write_begun(self, conn: AsyncConnection) -> None:
        if self.lock_timeout is not None:
            wait = timeout_ms(self.lock_timeout)
            await conn.exec_driver_sql(f"SET LOCAL lock_timeout = {wait}")

    def died_before_sending(self, exc: DBAPIError) -> bool:
        """asyncpg raises its client-side ``InterfaceError`` when a pooled connection that
        the server dropped while idle is used again: nothing reached the server. A
        connection lost in the middle of a statement is a ``PostgresConnectionError``
        instead, and what it did is not known."""
        if not exc.connection_invalidated:
            return False
        from asyncpg.exceptions import PostgresError
        from asyncpg.exceptions._base import InterfaceError

        cause = asyncpg_error(exc)
        return isinstance(cause, InterfaceError) and not isinstance(cause, PostgresError)
