"""The public surface is written once: the ``Checkpointer`` protocol. The repository and
the cache decorator each have every one of its methods with its very signature, so
neither can drift from it (nor from each other) unseen."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from tenxstore.cache import CachedCheckpointer
from tenxstore.protocol import Checkpointer
from tenxstore.repository import CheckpointRepository

METHODS = sorted(
    name
    for name, value in vars(Checkpointer).items()
    if callable(value) and not name.startswith("_")
)


def shape(function: Any) -> tuple[Any, ...]:
    """Parameters (name, kind, default, annotation as written) and return annotation."""
    signature = inspect.signature(function)
    return (
        [(p.name, p.kind, p.default, str(p.annotation)) for p in signature.parameters.values()],
        str(signature.return_annotation),
    )


def test_the_protocol_has_the_methods_it_is_checked_by() -> None:
    assert len(METHODS) > 30 and "aput_checkpoint" in METHODS and "adelete_user" in METHODS


@pytest.mark.parametrize("implementation", [CheckpointRepository, CachedCheckpointer])
@pytest.mark.parametrize("name", METHODS)
def test_every_checkpointer_has_each_method_as_the_protocol_writes_it(
    implementation: type, name: str
) -> None:
    assert shape(getattr(implementation, name)) == shape(getattr(Checkpointer, name))
