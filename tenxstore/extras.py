"""The optional extras: what is asked for that needs one which is not installed is a
:class:`~tenxstore.errors.MissingExtra` naming the ``pip install`` that brings it."""

from __future__ import annotations

import importlib.util

from .errors import MissingExtra

__all__ = ["install_hint", "require_extra"]


def install_hint(extra: str) -> str:
    """The command that installs ``extra``: ``pip install "tenxstore[<extra>]"``."""
    return f'pip install "tenxstore[{extra}]"'


def _found(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (a parent package that
    is missing, or one set to ``None`` in ``sys.modules``, counts as missing)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent; a module without __spec__
        return False


def require_extra(extra: str, *modules: str, needed_by: str) -> None:
    """Check that the modules of ``extra`` can be imported, before they are.

    Args:
        extra: The extra of ``pyproject.toml`` that brings them (``"mysql"``).
        modules: The modules that are imported next (``"asyncmy"``).
        needed_by: What needs them, as the message names it (``"a mysql:// URL"``).

    Raises:
        MissingExtra: One of ``modules`` is not installed.
    """
    missing = tuple(module for module in modules if not _found(module))
    if missing:
        raise MissingExtra(
            f"{needed_by} needs the {extra!r} extra ({', '.join(missing)} not found): "
            f"{install_hint(extra)}",
            extra,
            missing,
        )
