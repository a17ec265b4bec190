"""Public names loaded when first asked for (PEP 562).

A package lists, for each public name, the module it lives in; ``import tenxstore``
then costs the package itself, and ``tenxstore.CachedCheckpointer`` imports Redis
only when a program asks for the cache. A submodule is an attribute as it always was
(``tenxstore.telemetry.configure``): imported when first named. Type checkers and
IDEs read the same names from the package's ``if TYPE_CHECKING:`` imports, and the
package defines ``__getattr__`` only outside type checking, so a misspelt name is
still an error to mypy.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    package: str,
    rooms: Mapping[str, str],
    namespace: dict[str, Any],
    made: Mapping[str, Callable[[], Any]] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a package whose names load lazily.

    Args:
        package: The package's ``__name__``.
        rooms: Each public name and the module (relative to ``package``) holding it.
        namespace: The package's ``globals()``: a name, once loaded, is kept there
            and never looked up again.
        made: Names whose value a function makes when first asked for
            (``__version__``, read from the installed distribution's metadata).
    """
    makers = dict(made or {})

    def __getattr__(name: str) -> Any:
        room = rooms.get(name)
        if room is not None:
            value = getattr(importlib.import_module(f"{package}.{room}"), name)
        elif name in makers:
            value = makers[name]()
        elif _submodule(package, name):
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *rooms, *makers})

    return __getattr__, __dir__


# The console script's package: a program, not an attribute (importing it without the
# cli extra exits with the install hint).
_PROGRAMS = frozenset({"tenxstore.cli"})


def _submodule(package: str, name: str) -> bool:
    """Whether ``name`` is a public submodule of ``package`` (not yet imported)."""
    full = f"{package}.{name}"
    if name.startswith("_") or full in _PROGRAMS:
        return False
    return importlib.util.find_spec(full) is not None
