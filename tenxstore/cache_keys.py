"""The cache's keys: ``{key_prefix}:{thread_id}:{user_id}``, each id one segment.

An id of ``[A-Za-z0-9._-]`` is its own segment; any other is ``~`` and its base64url,
so no two ids share a segment and a key splits into its segments unambiguously.
``*`` is the user of calls to which isolation does not apply. The default prefix
(:data:`DEFAULT_KEY_PREFIX`) is told apart from the same text passed on purpose: the
store's id is appended to it (see :mod:`tenxstore.cache`).
"""

from __future__ import annotations

import re
from base64 import urlsafe_b64encode
from typing import Any

__all__ = ["DEFAULT_KEY_PREFIX", "DefaultPrefix", "cache_key", "glob_escape"]

_VERBATIM = re.compile(r"[A-Za-z0-9._-]+")
_UNSCOPED = "*"


class DefaultPrefix(str):
    """``"state_cache"`` as the default argument, told apart from the same text passed
    on purpose: the default gets the store's namespace appended, an explicit prefix is
    used verbatim."""

    __slots__ = ()


DEFAULT_KEY_PREFIX: str = DefaultPrefix("state_cache")


def _segment(value: Any) -> str:
    text = str(value)
    if _VERBATIM.fullmatch(text):
        return text
    # "~" never appears in a verbatim segment and ":" never in base64url: no two ids
    # share a segment, and a key splits into its segments unambiguously.
    return "~" + urlsafe_b64encode(text.encode()).decode().rstrip("=")


def cache_key(prefix: str, thread_id: Any, user_id: Any, isolated: bool) -> str:
    """The cache key of a thread for a user, or for unscoped calls (``*``)."""
    user = _segment(user_id) if isolated else _UNSCOPED
    return f"{prefix}:{_segment(thread_id)}:{user}"


def glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis glob."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)
