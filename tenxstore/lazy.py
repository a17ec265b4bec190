"""Public names loaded when first asked for (PEP 562).

A package lists, for each public name, the module it lives in; ``import tenxstore``
then costs the package itself, and ``tenxstore.CachedCheckpointer`` imports Redis
only when a program asks for the cache. Type checkers and IDEs read the same names
from the package's ``if TYPE_CHECKING:`` imports.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    package: str, rooms: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a package whose names load lazily.

    Args:
        package: The package's ``__name__``.
        rooms: Each public name and the module (relative to ``package``) holding it.
        namespace: The package's ``globals()``: a name, once loaded, is kept there
            and never looked up again.
    """

    def __getattr__(name: str) -> Any:
        room = rooms.get(name)
        if room is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{room}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *rooms})

    return __getattr__, __dir__
