"""Keys as they are given: a key ring's ``(key_id, key)`` pairs checked and decoded,
the ``TENXSTORE_KEYS`` text split into them, and the environment that configures a
ring (:meth:`tenxstore.crypto.KeyRing.parse` and :meth:`~tenxstore.crypto.KeyRing.from_env`).

An error names a key ring entry by its place and never shows what it holds: a key
given where its id belongs (``base64key:id``, or a bare key) would be printed.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from .envelopes import KEY_ID, OLD_VERSION, VERSION
from .errors import ConfigError

__all__ = [
    "ENV",
    "ENVELOPE_ENV",
    "REQUIRE_ENV",
    "SEALING_ENV",
    "EnvRing",
    "checked_pairs",
    "env_ring",
    "parsed_pairs",
]


ENV = "TENXSTORE_KEYS"
"""The environment variable read when no key ring is given in code."""
REQUIRE_ENV = "TENXSTORE_REQUIRE_SEALED"
"""The environment variable that turns on
:attr:`~tenxstore.crypto.KeyRing.require_sealed` (``1``/``0``)."""
ENVELOPE_ENV = "TENXSTORE_ENVELOPE"
"""The environment variable naming the envelope format a ring seals in (``tx2``, the
default; ``tx1`` while a deployment is upgraded, see
:class:`~tenxstore.crypto.KeyRing`)."""
SEALING_ENV = "TENXSTORE_SEALING_KEY"
"""The environment variable naming the key that seals
(:attr:`~tenxstore.crypto.KeyRing.current`); unset or empty: the first key of
``TENXSTORE_KEYS``."""
KEY_BYTES = 32  # AES-256

_SHOWN_ID = 32
"""The longest key id an error repeats: a 32-byte key in base64 is 43 or 44 characters,
and one given where its id belongs (``base64key:id``) may fit the id's grammar."""


def shown(key_id: Any) -> str | None:
    """A key id as an error may repeat it (quoted), or None when it could be a key."""
    if isinstance(key_id, str) and KEY_ID.fullmatch(key_id) and len(key_id) <= _SHOWN_ID:
        return repr(key_id)
    return None


def _entry(place: int, total: int, key_id: Any) -> str:
    """A key ring entry as an error names it: its place, and its id when that cannot
    be a key (never what the entry holds)."""
    where = f"key ring entry {place} of {total}"
    named = shown(key_id)
    return f"{where} ({named})" if named else where


def _decode_key(where: str, key: str | bytes) -> bytes:
    if isinstance(key, str):
        text = key.strip().replace("-", "+").replace("_", "/")
        try:  # standard or URL-safe, padded or not; any other character is refused
            key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"{where}: the key is not base64") from None
    if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        got = len(key) if isinstance(key, bytes) else type(key).__name__
        raise ConfigError(f"{where}: a key must be {KEY_BYTES} bytes (AES-256), not {got}")
    return key


_FLAGS = {"": False, "0": False, "false": False, "no": False, "1": True, "true": True, "yes": True}


def checked_pairs(
    keys: Mapping[str, str | bytes] | Iterable[tuple[str, str | bytes]],
) -> list[tuple[str, bytes]]:
    """A key ring's ``(key_id, key)`` pairs, in order, each id checked (its grammar,
    unique also ignoring case) and each key decoded to its 32 bytes.

    Raises:
        ConfigError: No key, an entry that is not a pair, a bad or repeated id, or a
            key that is not 32 bytes (see :class:`~tenxstore.crypto.KeyRing`).
    """
    pairs = list(keys.items() if isinstance(keys, Mapping) else keys)
    if not pairs:
        raise ConfigError("a key ring needs at least one key")
    found: dict[str, bytes] = {}
    for place, pair in enumerate(pairs, 1):
        where = _entry(place, len(pairs), None)
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            size = f" of {len(pair)}" if isinstance(pair, (tuple, list)) else ""
            raise ConfigError(
                f"{where} must be a (key_id, key) pair, not a {type(pair).__name__}{size}"
                " (not shown: it may hold a key)"
            )
        key_id, key = pair
        if not isinstance(key_id, str) or not KEY_ID.fullmatch(key_id):
            got = type(key_id).__name__
            if isinstance(key_id, str):
                got = f"{len(key_id)} characters"
            raise ConfigError(
                f"{where}: the key id must be 1 to 64 characters of A-Z a-z 0-9 _ . -,"
                f" not {got} (not shown: it may be a key, given where its id belongs)"
            )
        where = _entry(place, len(pairs), key_id)
        if key_id in found:
            raise ConfigError(f"{where}: its key id appears twice in the key ring")
        same = [i for i, k in enumerate(found, 1) if k.lower() == key_id.lower()]
        if same:
            raise ConfigError(
                f"{where}: its key id differs only in case from entry {same[0]}'s; key "
                "ids must differ ignoring case (a database may compare them without case)"
            )
        found[key_id] = _decode_key(where, key)
    return list(found.items())


def parsed_pairs(text: str) -> list[tuple[str, str | bytes]]:
    """The ``(key_id, key)`` pairs of ``"key_id:base64key,key_id:base64key"``, the
    keys not yet decoded (:func:`checked_pairs` does that).

    Raises:
        ConfigError: ``text`` is not a str, or an entry has no ``:``.
    """
    if not isinstance(text, str):
        raise ConfigError(f"{ENV} must be a str, not {type(text).__name__}")
    pairs: list[tuple[str, str | bytes]] = []
    parts = text.split(",")
    for place, part in enumerate(parts, 1):
        key_id, sep, key = part.strip().partition(":")
        if not sep:  # a bare key, most likely: nothing of it is shown
            raise ConfigError(
                f"{ENV}: entry {place} of {len(parts)} is not key_id:base64key (it has no"
                " ':'; not shown: it may be a key)"
            )
        pairs.append((key_id, key))
    return pairs


class EnvRing(NamedTuple):
    """A key ring as the environment gives it (:func:`env_ring`)."""

    text: str
    """``TENXSTORE_KEYS``: the pairs' text, for :func:`parsed_pairs`."""
    sealing: str | None
    """``TENXSTORE_SEALING_KEY``, or None (unset or empty: the first key seals)."""
    require_sealed: bool
    """``TENXSTORE_REQUIRE_SEALED`` read as a flag."""
    envelope: str
    """``TENXSTORE_ENVELOPE``, or ``tx2`` when unset or empty."""


def env_ring(environ: Mapping[str, str]) -> EnvRing | None:
    """The key ring settings of ``environ``, checked; None when ``TENXSTORE_KEYS`` is
    unset or empty (and none of the others is set).

    Raises:
        ConfigError: As :meth:`tenxstore.crypto.KeyRing.from_env` says, but for the
            keys themselves (checked when the ring is made).
    """
    text = environ.get(ENV, "").strip()
    sealing = environ.get(SEALING_ENV, "").strip() or None
    envelope = environ.get(ENVELOPE_ENV, "").strip() or None
    flag = environ.get(REQUIRE_ENV, "").strip().lower()
    if flag not in _FLAGS:
        raise ConfigError(f"{REQUIRE_ENV} must be 1 or 0 (true/false), not {flag[:16]!r}")
    if not text:
        given_ones = ((REQUIRE_ENV, _FLAGS[flag]), (SEALING_ENV, sealing))
        for name, given in (*given_ones, (ENVELOPE_ENV, envelope)):
            if given:
                raise ConfigError(f"{name} is set, and {ENV} gives no key")
        return None
    if envelope not in (None, VERSION, OLD_VERSION):
        raise ConfigError(
            f"{ENVELOPE_ENV} must be {VERSION} or {OLD_VERSION}, not {envelope[:16]!r}"
        )
    return EnvRing(text, sealing, _FLAGS[flag], envelope or VERSION)
