"""What the cache stores of a state: its text, or (with a key ring) its text sealed.

The entry's version and incarnation are spliced in front by the Lua script, and the
name of the master that stored it in front of the JSON (``m:<master_replid>:``, see
:mod:`tenxstore.redis_cache`); this module makes the rest. A sealed entry's state is
one member, :data:`SEALED_MEMBER`, bound to the thread, the key, the version, the
incarnation and the user the key names, so one replayed under any other does not open.
"""

from __future__ import annotations

from typing import Any

from .crypto import CACHE, KeyRing, Life
from .redis_cache import INCARNATION_MEMBER
from .serde import encode_state

__all__ = ["SEALED_MEMBER", "entry_body", "entry_life", "sealed_column"]

SEALED_MEMBER = "__checkpoint_sealed__"
"""The one member of an encrypted entry's state: the state's text, sealed."""


def sealed_column(key: str, version: int, incarnation: int | None) -> str:
    """What a sealed entry is bound to besides its thread and life: the incarnation and
    version the guard reads in clear, and the key it is stored under. A sealed state
    replayed under another version, another life of the thread or another key (another
    user's) does not open: a miss."""
    return f"{CACHE}:{incarnation}:{version}:{key}"


def entry_life(incarnation: int, user: Any) -> Life:
    """The life a cache entry is sealed for: the incarnation it carries, and as its
    owner the user its key names — the thread's owner for a call under isolation (which
    only ever reads its own threads), None for the unscoped entry (``*``: the cache
    cannot know the owner on a hit, which reads no database)."""
    return Life(incarnation, user)


def entry_body(
    state: dict[str, Any],
    text: str | None = None,
    keys: KeyRing | None = None,
    thread_id: Any = None,
    key: str = "",
    version: int = 0,
    incarnation: int | None = None,
    user: Any = None,
) -> tuple[str, str] | None:
    """A state's text (``text`` when the store has encoded it already) as (stdlib mark,
    members after ``{``); None when the state uses the incarnation's or the sealed
    member itself (it cannot be cached, and is served from the database instead).

    With ``keys`` the entry's state is one member, the state's text sealed for the
    thread, the key, the version and the incarnation (which stay in clear for the
    guard, and are bound by the associated data) and the user the key names (see
    :func:`entry_life`); None when the incarnation is not known (the script would
    pick it, and the seal could not name it)."""
    if INCARNATION_MEMBER in state or SEALED_MEMBER in state:
        return None
    if text is None:
        text = encode_state(state)
    if keys is not None:  # an envelope is base64 and [A-Za-z0-9_.-:!]: no JSON escape
        if incarnation is None:
            return None
        column = sealed_column(key, version, incarnation)
        sealed = keys.seal(text, thread_id, column, entry_life(incarnation, user))
        return "", f',"{SEALED_MEMBER}":"{sealed}"}}'
    mark = " " if text.startswith(" ") else ""
    text = text[len(mark) :]
    return mark, ("}" if text == "{}" else "," + text[1:])
