"""One backend per database mode, chosen from the URL (or engine) and ``pool_mode``.

=====================  ===========================================================
``postgresql``         :class:`~.postgres.PostgresBackend` — session mode
``pgbouncer``          :class:`~.pgbouncer.PgBouncerBackend` — behind a transaction
                       pooler (``pool_mode="transaction"``)
``sqlite``             :class:`~.sqlite.SqliteBackend` — a database file
``memory``             :class:`~.sqlite.MemoryBackend` — an in-memory database
``mysql``              :class:`~.mysql.MysqlBackend` — MySQL 8 or MariaDB (asyncmy)
=====================  ===========================================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import make_url
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from ..errors import ConfigError
from ..extras import require_extra
from ..lazy import lazy_names
from ..validate import masked_url
from .base import DEFAULT_LOCK_TIMEOUT_S, Backend, DialectName
from .pgoptions import several_hosts
from .replicas import ReplicaSet
from .retry import RetryPolicy
from .standbys import checked_replica_urls, replica_lag, replicas_of_url

if TYPE_CHECKING:
    from .pgbouncer import transaction_pooling_args

__all__ = [
    "DEFAULT_LOCK_TIMEOUT_S",
    "POOL_MODES",
    "Backend",
    "DialectName",
    "PoolMode",
    "async_url",
    "open_backend",
    "open_with_replicas",
    "transaction_pooling_args",
]

# The modes' modules are imported when a URL names their database: a program on SQLite
# never loads the PostgreSQL or MySQL machinery.
if not TYPE_CHECKING:  # mypy reads the names above
    __getattr__, __dir__ = lazy_names(
        __name__, {"transaction_pooling_args": "pgbouncer"}, globals()
    )

PoolMode = Literal["session", "transaction"]
POOL_MODES: tuple[PoolMode, ...] = ("session", "transaction")


def async_url(url: str | URL) -> URL:
    """Return ``url`` with the async driver of its dialect.

    Raises:
        ConfigError: The URL is not PostgreSQL, SQLite, MySQL or MariaDB.
    """
    try:
        parsed = make_url(several_hosts(url) if isinstance(url, str) else url)
    except ConfigError:
        raise
    except Exception as exc:  # sqlalchemy raises ArgumentError; any parse failure is bad input
        raise ConfigError(f"not a database URL: {masked_url(url)!r}") from exc
    backend = parsed.get_backend_name()
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+asyncpg")
    if backend == "sqlite":
        _check_sqlite(url, parsed)
        return parsed.set(drivername="sqlite+aiosqlite")
    if backend in ("mysql", "mariadb"):
        # One driver for both: the dialect tells MariaDB from MySQL by the server's version.
        return parsed.set(drivername="mysql+asyncmy")
    raise ConfigError(
        f"unsupported database {backend!r}: use postgresql://, sqlite://, mysql:// or mariadb://"
    )


def _check_sqlite(given: str | URL, parsed: URL) -> None:
    """Refuse a SQLite URL with a host: ``sqlite://agent.db`` (two slashes) names a
    host ``agent.db`` and no file, which would otherwise surface deep in the driver."""
    if not (parsed.host or parsed.port or parsed.username or parsed.password):
        return
    shown = masked_url(given)  # as the caller wrote it, never the driver's rewrite
    scheme, _, rest = shown.partition("://")
    what = f"a host ({parsed.host!r})" if parsed.host else "a user, password or port"
    raise ConfigError(
        f"{shown!r} names {what}, and a SQLite URL names a file: "
        f'did you mean "{scheme}:///{rest}"? (sqlite:///relative/path.db, '
        "sqlite:////absolute/path.db; sqlite:// alone is an in-memory database)"
    )


def _backend_class(dialect: str, driver: str, url: URL, pool_mode: PoolMode) -> type[Backend]:
    if dialect == "postgresql":
        if driver != "asyncpg":
            raise ConfigError(f"PostgreSQL needs the asyncpg driver, not {driver!r}")
        if pool_mode == "transaction":
            from .pgbouncer import PgBouncerBackend

            return PgBouncerBackend
        from .postgres import PostgresBackend

        return PostgresBackend
    if dialect in ("mysql", "mariadb"):
        if driver not in ("asyncmy", "aiomysql"):
            raise ConfigError(f"MySQL needs the asyncmy or aiomysql driver, not {driver!r}")
        if driver == "asyncmy":
            require_extra("mysql", "asyncmy", needed_by=f"a {dialect}:// URL")
        if pool_mode == "transaction":
            raise ConfigError("pool_mode='transaction' is for PostgreSQL behind PgBouncer")
        from .mysql import MysqlBackend

        return MysqlBackend
    if dialect != "sqlite":
        raise ConfigError(
            f"unsupported database {dialect!r}: use PostgreSQL, SQLite, MySQL or MariaDB"
        )
    if pool_mode == "transaction":
        raise ConfigError("pool_mode='transaction' is for PostgreSQL behind PgBouncer")
    from .sqlite import MemoryBackend, SqliteBackend, is_memory

    return MemoryBackend if is_memory(url) else SqliteBackend


def open_backend(
    url_or_engine: str | URL | AsyncEngine,
    *,
    engine_options: dict[str, Any] | None = None,
    lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT_S,
    pool_mode: PoolMode = "session",
) -> Backend:
    """The backend of a database URL (creating its engine) or of a caller's engine.

    Raises:
        ConfigError: An unsupported database or driver, or options that do not apply.
    """
    if isinstance(url_or_engine, AsyncEngine):
        if engine_options:
            raise ConfigError("engine_options apply only to engines tenxstore creates")
        engine = url_or_engine
        cls = _backend_class(engine.dialect.name, engine.dialect.driver, engine.url, pool_mode)
        cls.prepare(engine, lock_timeout)
        return cls(engine, owns_engine=False, lock_timeout=lock_timeout)
    if not isinstance(url_or_engine, (str, URL)):
        raise ConfigError(
            f"url_or_engine must be a URL or an AsyncEngine, not {type(url_or_engine).__name__}"
        )
    url = async_url(url_or_engine)
    cls = _backend_class(url.get_backend_name(), url.get_driver_name(), url, pool_mode)
    options = engine_options or {}

    def make() -> AsyncEngine:
        return cls.create_engine(url, options, lock_timeout)

    return cls(make(), owns_engine=True, lock_timeout=lock_timeout, make_engine=make)


def open_with_replicas(
    url_or_engine: str | URL | AsyncEngine,
    replica_urls: Any,
    max_replica_lag: Any,
    retry: RetryPolicy | None = None,
    **options: Any,
) -> Backend:
    """The primary's backend (:func:`~tenxstore.backends.open_backend` with
    ``options``), with its standbys — those ``replica_urls`` and the URL name —
    opened alike as its :attr:`~.base.Backend.replicas` (see :mod:`.standbys`); each
    retries as ``retry`` says (None: the default policy).

    Raises:
        ConfigError: Bad replica arguments, or replicas of anything but PostgreSQL.
    """
    standbys: list[str | URL] = checked_replica_urls(replica_urls)
    in_url = None
    if isinstance(url_or_engine, (str, URL)):
        url_or_engine, named, in_url = replicas_of_url(async_url(url_or_engine))
        standbys += named
    max_lag = replica_lag(max_replica_lag, in_url)
    primary, *replicas = [open_backend(url, **options) for url in [url_or_engine, *standbys]]
    if retry is not None:
        for backend in [primary, *replicas]:
            backend.retry = retry
    if replicas:
        if any(each.dialect != "postgresql" for each in [primary, *replicas]):
            raise ConfigError("replica_urls are PostgreSQL standbys of a PostgreSQL primary")
        primary.replicas = ReplicaSet(primary, replicas, max_lag)
    return primary
