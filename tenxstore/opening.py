"""Opening a repository: its arguments checked, the backend its URL names opened, and
the :class:`~tenxstore.store.Store` its parts share built on it.

Every check raises :class:`~tenxstore.errors.ConfigError` before anything is opened
but the backend itself; the order of the checks is the order of the constructor's
arguments as :class:`~tenxstore.repository.CheckpointRepository` has always made them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import partial
from typing import Any, NamedTuple

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from .backends import POOL_MODES, PoolMode, open_with_replicas
from .backends.retry import RetryPolicy
from .crypto import KeyRing
from .errors import ConfigError
from .models import tables_for
from .readiness import migrate_on
from .statements import Statements
from .store import Settings, Store
from .validate import (
    IdType,
    check_bool,
    check_choice,
    check_id_type,
    check_positive_number,
    check_schema_name,
    is_int,
)

__all__ = ["Opened", "open_store"]


class Opened(NamedTuple):
    """What opening gives the repository: the store and the checked arguments it keeps."""

    store: Store
    pool_mode: PoolMode
    lock_timeout: float | None


def _checked_settings(
    *,
    state_history_limit: int,
    enforce_user_isolation: bool,
    id_type: IdType,
    user_id_type: IdType,
    tool_lease_seconds: float,
    keys: KeyRing | None,
) -> Settings:
    """The settings the repository's parts share, each argument checked."""
    if not is_int(state_history_limit):
        raise ConfigError(f"state_history_limit must be an int, not {state_history_limit!r}")
    if state_history_limit < 1:
        raise ConfigError(f"state_history_limit must be at least 1, not {state_history_limit}")
    return Settings(
        enforce_user_isolation=check_bool("enforce_user_isolation", enforce_user_isolation),
        id_type=check_id_type("id_type", id_type),
        user_id_type=check_id_type("user_id_type", user_id_type),
        state_history_limit=state_history_limit,
        tool_lease=timedelta(
            seconds=check_positive_number("tool_lease_seconds", tool_lease_seconds)
        ),
        keys=keys,
    )


def _checked_keys(keys: KeyRing | None) -> KeyRing | None:
    """The key ring passed, else the one ``TENXSTORE_KEYS`` names (None: in clear)."""
    if keys is None:
        return KeyRing.from_env()
    if not isinstance(keys, KeyRing):
        raise ConfigError(f"keys must be a tenxstore.KeyRing, not {type(keys).__name__}")
    return keys


def open_store(
    url_or_engine: str | URL | AsyncEngine,
    *,
    schema: str | None,
    state_history_limit: int,
    enforce_user_isolation: bool,
    id_type: IdType,
    user_id_type: IdType,
    engine_options: dict[str, Any] | None,
    tool_lease_seconds: float,
    lock_timeout: float | None,
    pool_mode: PoolMode,
    keys: KeyRing | None,
    retry: RetryPolicy | None,
    replica_urls: Sequence[str | URL] | None = None,
    max_replica_lag: float | None = None,
) -> Opened:
    """Check the constructor's arguments, open the backend of the URL and build the
    store (whose schema the backend creates at first use when its database is new).

    Raises:
        ConfigError: An argument is invalid.
    """
    pool_mode = check_choice("pool_mode", pool_mode, POOL_MODES)
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ConfigError(f"retry must be a tenxstore.RetryPolicy, not {type(retry).__name__}")
    keys = _checked_keys(keys)
    if lock_timeout is not None:
        lock_timeout = check_positive_number("lock_timeout", lock_timeout)
    settings = _checked_settings(
        state_history_limit=state_history_limit,
        enforce_user_isolation=enforce_user_isolation,
        id_type=id_type,
        user_id_type=user_id_type,
        tool_lease_seconds=tool_lease_seconds,
        keys=keys,
    )
    schema = check_schema_name(schema)
    if engine_options is not None and not isinstance(engine_options, dict):
        raise ConfigError("engine_options must be a dict")
    backend = open_with_replicas(
        url_or_engine,
        replica_urls,
        max_replica_lag,
        engine_options=engine_options,
        lock_timeout=lock_timeout,
        retry=retry,
        pool_mode=pool_mode,
    )
    if schema is not None and not backend.supports_schema:
        raise ConfigError(f"schema= is a PostgreSQL option; {backend.dialect} has no schemas")
    tables = tables_for(settings.id_type, settings.user_id_type, schema)
    store = Store(backend, Statements(tables, backend), settings, schema)
    # a database new with every checkpointer (in memory) is migrated at first use
    backend.create_schema_on_first_use(
        partial(migrate_on, store), template=(settings.id_type, settings.user_id_type)
    )
    return Opened(store, pool_mode, lock_timeout)
