"""libpq's URL options on asyncpg: what the query of a PostgreSQL URL may say.

A URL that works with ``psql`` — ``postgresql://app@db/agents?sslmode=require&
application_name=worker`` — must work here too. SQLAlchemy hands every query option
of an asyncpg URL to ``asyncpg.connect`` as a keyword, which knows none of libpq's
names (``TypeError: connect() got an unexpected keyword argument 'sslmode'``, at the
first call). So the options are read once, at construction, and each is given to
asyncpg the way asyncpg takes it:

* the TLS and session options asyncpg parses from a libpq DSN itself (``sslmode``,
  ``sslrootcert``, ``sslcert``, ``sslkey``, ``sslpassword``, ``sslcrl``,
  ``sslnegotiation``, ``ssl_min_protocol_version``, ``ssl_max_protocol_version``,
  ``target_session_attrs``, ``krbsrvname``, ``gsslib``, ``passfile``, ``service``)
  go to it as such a DSN (``dsn=``: asyncpg builds the TLS context exactly as it
  documents; the URL's host, port, user and database still win);
* ``application_name`` and ``options`` (``-c name=value`` pairs, as libpq sends them)
  become server settings; ``connect_timeout`` asyncpg's ``timeout``;
* what SQLAlchemy itself reads stays (``host`` for several hosts or a socket
  directory, ``prepared_statement_cache_size``).

Several hosts are named as libpq names them — ``postgresql://h1:5432,h2:5432/db``
(:func:`several_hosts` turns that into SQLAlchemy's ``?host=h1:5432&host=h2:5432``,
which is accepted as well) — and asyncpg tries them in order. With several hosts and
no ``target_session_attrs``, tenxstore asks for ``read-write`` (libpq's default is
``any``, which would settle for a standby and fail every write): the node that is the
primary now, whichever it is.

Anything else is refused with :class:`~tenxstore.errors.ConfigError` naming the
option, before any I/O — never a raw ``TypeError`` on the first call.
"""

from __future__ import annotations

import re
import shlex
from typing import Any
from urllib.parse import unquote, urlencode

from sqlalchemy.engine import URL

from ..errors import ConfigError

__all__ = ["asyncpg_options", "several_hosts"]

_THROUGH_DSN = frozenset(
    (
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslkey",
        "sslpassword",
        "sslcrl",
        "sslnegotiation",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "target_session_attrs",
        "krbsrvname",
        "gsslib",
        "passfile",
        "service",
    )
)
_ACCEPTED = _THROUGH_DSN | {"application_name", "options", "connect_timeout"}
_KEPT = frozenset(("host", "port", "prepared_statement_cache_size"))
_SSLMODES = frozenset(("disable", "allow", "prefer", "require", "verify-ca", "verify-full"))


def _one(name: str, value: str | tuple[str, ...]) -> str:
    if isinstance(value, tuple):
        if len(value) != 1:
            raise ConfigError(f"the URL option {name!r} is given {len(value)} times")
        value = value[0]
    return value


def _settings(options: str) -> dict[str, str]:
    """libpq's ``options``: ``-c name=value`` (or ``--name=value``) pairs."""
    try:
        words = shlex.split(options)
    except ValueError as exc:
        raise ConfigError(f"the URL option 'options' is not valid: {exc}") from None
    found: dict[str, str] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if word == "-c" and i + 1 < len(words):
            pair, i = words[i + 1], i + 2
        elif word.startswith("-c") and len(word) > 2:
            pair, i = word[2:], i + 1
        elif word.startswith("--"):  # --name=value is -c name=value (dashes: underscores)
            name, sep, value = word[2:].partition("=")
            pair, i = f"{name.replace('-', '_')}{sep}{value}", i + 1
        else:
            raise ConfigError(
                "the URL option 'options' takes -c name=value pairs (as libpq's does), "
                f"not {word!r}"
            )
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ConfigError(f"the URL option 'options': {pair!r} is not name=value")
        found[name] = value
    return found


# What SQLAlchemy reads as a URL's user and password: a user without ":" or "/", then
# a password without "@" (a password may hold "/", "?" or ","), then "@".
_USERINFO = re.compile(r"[^:/]*(?::[^@]*)?@")
_DEFAULT_PORT = "5432"  # libpq's, for a host of a list named without one


def several_hosts(url: str) -> str:
    """A libpq URL naming several hosts (``postgresql://u@h1:5432,h2/db?...``) as
    SQLAlchemy names them (``postgresql://u@/db?host=h1:5432&host=h2:5432&...``: each
    with a port, 5432 where none is given); any other URL as it is.

    Raises:
        ConfigError: A host of the list is empty or an IPv6 address (SQLAlchemy's list
            of hosts cannot name one: use a host name), or its port is not a number.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.split("+")[0] not in ("postgresql", "postgres"):
        return url
    found = _USERINFO.match(rest)
    userinfo = found.group(0) if found else ""
    rest = rest[len(userinfo) :]
    ends = [i for i in (rest.find("/"), rest.find("?")) if i >= 0]
    end = min(ends) if ends else len(rest)
    hosts, tail = rest[:end], rest[end:]
    if "," not in hosts:
        return url
    named = []
    for host in hosts.split(","):
        name, colon, port = host.rpartition(":")
        if not colon:
            name, port = host, _DEFAULT_PORT
        name = unquote(name)  # a socket directory is percent-encoded in a URL
        digits = port.isascii() and port.isdigit()
        if not name or not digits or name.startswith("[") or ":" in name:
            raise ConfigError(
                f"the URL names the hosts {hosts!r}: each must be host or host:port, "
                "a name or an IPv4 address (postgresql://u@h1:5432,h2:5432/db)"
            )
        named.append(("host", f"{name}:{port}"))
    path, _, query = tail.partition("?")
    joined = urlencode(named, safe=":/")
    return f"{scheme}://{userinfo}{path or '/'}?{joined}" + (f"&{query}" if query else "")


def asyncpg_options(url: URL) -> tuple[URL, dict[str, Any]]:
    """A PostgreSQL URL without the libpq options asyncpg cannot take as keywords, and
    the ``connect_args`` that say them to asyncpg.

    Raises:
        ConfigError: An option asyncpg has no equivalent of, given twice, or invalid.
    """
    dsn: dict[str, str] = {}
    settings: dict[str, str] = {}
    args: dict[str, Any] = {}
    kept: dict[str, str | tuple[str, ...]] = {}
    for name, value in url.query.items():
        if name in _KEPT:
            kept[name] = value
            continue
        text = _one(name, value)
        if name in _THROUGH_DSN:
            if name == "sslmode" and text not in _SSLMODES:
                raise ConfigError(
                    f"sslmode must be one of {', '.join(sorted(_SSLMODES))}, not {text!r}"
                )
            dsn[name] = text
        elif name == "application_name":
            settings["application_name"] = text
        elif name == "options":
            settings.update(_settings(text))
        elif name == "connect_timeout":
            try:
                timeout = float(text)
            except ValueError:
                raise ConfigError(
                    f"connect_timeout must be a number of seconds, not {text!r}"
                ) from None
            if timeout > 0:  # libpq: 0 (or less) waits indefinitely
                args["timeout"] = timeout
        else:
            raise ConfigError(
                f"the URL option {name!r} has no asyncpg equivalent; tenxstore takes libpq's "
                f"{', '.join(sorted(_ACCEPTED))} (engine_options={{'connect_args': {{...}}}} "
                "passes anything to asyncpg)"
            )
    several = kept.get("host")
    if (isinstance(several, tuple) and len(several) > 1) or "," in str(several or ""):
        dsn.setdefault("target_session_attrs", "read-write")  # the primary, wherever it is
    if dsn:
        args["dsn"] = "postgresql://?" + urlencode(dsn)
    if settings:
        args["server_settings"] = settings
    return url.set(query=kept), args
