"""How a :class:`~tenxstore.MemoryStore` is opened: its arguments checked, and the
repository whose database it shares — one it opens from a URL, or the one a
checkpointer is or wraps."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from ..crypto import KeyRing
from ..errors import ConfigError
from ..repository import CheckpointRepository
from ..validate import check_bool, is_int

__all__ = ["check_options", "open_repository"]


def check_options(
    memory_history_limit: Any, keyword_index: Any, enforce_user_isolation: Any
) -> bool:
    """The store's own options checked, in this order; ``keyword_index`` as a bool."""
    if not is_int(memory_history_limit) or memory_history_limit < 1:
        raise ConfigError(
            f"memory_history_limit must be an int of at least 1, not {memory_history_limit!r}"
        )
    keyword = check_bool("keyword_index", keyword_index)
    if enforce_user_isolation is not None:
        check_bool("enforce_user_isolation", enforce_user_isolation)
    return keyword


def open_repository(
    url_or_checkpointer: Any,
    schema: str | None,
    keys: KeyRing | None,
    enforce_user_isolation: bool | None,
    repository_options: dict[str, Any],
) -> tuple[CheckpointRepository, bool]:
    """The repository the store is on, and whether the store owns it (opened it from
    a URL, and so closes it).

    Raises:
        ConfigError: Not a URL, an engine or a tenxstore checkpointer; or
            ``schema``/``keys``/options given with a checkpointer.
    """
    if isinstance(url_or_checkpointer, (str, URL, AsyncEngine)):
        url = url_or_checkpointer
        if isinstance(url, str) and url == "memory":
            url = "sqlite+aiosqlite://"
        repository = CheckpointRepository(
            url,
            schema=schema,
            keys=keys,
            enforce_user_isolation=True
            if enforce_user_isolation is None
            else enforce_user_isolation,
            **repository_options,
        )
        return repository, True
    shared = _repository_of(url_or_checkpointer)
    if shared is None:
        raise ConfigError(
            "url_or_checkpointer must be a database URL, an AsyncEngine or a "
            f"tenxstore checkpointer, not {type(url_or_checkpointer).__name__}"
        )
    given = [n for n, v in (("schema", schema), ("keys", keys)) if v is not None]
    if given or repository_options:
        names = ", ".join([*given, *repository_options])
        raise ConfigError(
            f"{names}: a store made from a checkpointer shares its database, "
            "schema and key ring; give them to the checkpointer"
        )
    return shared, False


def _repository_of(checkpointer: Any) -> CheckpointRepository | None:
    """The repository a checkpointer is or wraps (``.inner``, as deep as it goes)."""
    seen = checkpointer
    for _ in range(8):
        if isinstance(seen, CheckpointRepository):
            return seen
        seen = getattr(seen, "inner", None)
        if seen is None:
            return None
    return None
