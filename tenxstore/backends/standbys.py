"""The standbys a repository reads from: named by ``replica_urls=`` or by the URL's own
``replica=`` options, checked, and opened like the primary (see :mod:`.replicas`).

The URL form keeps a deployment's whole database address in one setting::

    postgresql://app:secret@primary:5432/agents?replica=standby-1&replica=standby-2:5433&max_replica_lag=2

Each ``replica=`` is a ``host[:port]`` (port 5432 when left out) that shares
everything else with the primary's URL: user, password, database and options.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import URL

from ..errors import ConfigError
from ..validate import check_positive_number, masked_url
from .replicas import DEFAULT_MAX_LAG

__all__ = ["checked_replica_urls", "replica_lag", "replicas_of_url"]

#: The options of a primary's URL that do not carry over to its standbys.
_PRIMARY_ONLY = ("replica", "max_replica_lag", "host", "target_session_attrs")


def _host_port(spec: str, url: URL) -> URL:
    """The primary's URL at the standby ``spec`` (``host[:port]``)."""
    host, colon, port = spec.partition(":")
    if not host or "/" in spec or "@" in spec or (colon and not port.isdigit()):
        raise ConfigError(
            f"replica= must be host[:port], not {spec!r} (an IPv6 address: replica_urls=)"
        )
    return url.difference_update_query(_PRIMARY_ONLY).set(
        host=host, port=int(port) if port else 5432
    )


def replicas_of_url(url: URL) -> tuple[URL, list[URL], float | None]:
    """The primary's URL without the replica options, the standbys' URLs its
    ``replica=`` options name, and its ``max_replica_lag=`` (None: not given).

    Raises:
        ConfigError: A ``replica=`` that is not ``host[:port]``, a bad lag.
    """
    found = url.query.get("replica")
    lag_given = url.query.get("max_replica_lag")
    if found is None and lag_given is None:
        return url, [], None
    specs = [found] if isinstance(found, str) else list(found or ())
    standbys = [_host_port(spec, url) for spec in specs]
    lag: float | None = None
    if lag_given is not None:
        if not isinstance(lag_given, str):
            raise ConfigError("max_replica_lag= is given once")
        try:
            seconds = float(lag_given)
        except ValueError:
            raise ConfigError(
                f"max_replica_lag= must be a number of seconds, not {lag_given!r}"
            ) from None
        lag = check_positive_number("max_replica_lag", seconds)
    return url.difference_update_query(["replica", "max_replica_lag"]), standbys, lag


def checked_replica_urls(replica_urls: Any) -> list[str | URL]:
    """``replica_urls=`` checked: a list or tuple of URLs (str or ``URL``).

    Raises:
        ConfigError: Anything else.
    """
    if replica_urls is None:
        return []
    if isinstance(replica_urls, (str, URL)) or not isinstance(replica_urls, Sequence):
        raise ConfigError(
            "replica_urls must be a list of URLs (one per standby), not "
            f"{type(replica_urls).__name__}"
        )
    for url in replica_urls:
        if not isinstance(url, (str, URL)) or not str(url):
            raise ConfigError(f"each of replica_urls is a database URL, not {masked_url(url)!r}")
    return list(replica_urls)


def replica_lag(given: Any, in_url: float | None) -> float:
    """The lag bound: the argument, else the URL's, else :data:`DEFAULT_MAX_LAG`."""
    if given is not None:
        return check_positive_number("max_replica_lag", given)
    return DEFAULT_MAX_LAG if in_url is None else in_url
