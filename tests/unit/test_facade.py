"""The public surface is written once: the ``Checkpointer`` protocol. The repository and
the cache decorator each have every one of its methods with its very signature, so
neither can drift from it (nor from each other) unseen."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from tenxstore.cache import CachedCheckpointer
from tenxstore.exports import ThreadExports
from tenxstore.ledger import ToolLedger
from tenxstore.lifecycle import Lifecycle
from tenxstore.protocol import Checkpointer
from tenxstore.repository import CheckpointRepository
from tenxstore.stats import Stats

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


COLLABORATORS: dict[str, type] = {
    "ledger": ToolLedger,
    "exports": ThreadExports,
    "lifecycle": Lifecycle,
    "statistics": Stats,
    "inner": CheckpointRepository,
}


FORWARDS = [
    (implementation.__name__, name, to)
    for implementation in (CheckpointRepository, CachedCheckpointer)
    for name in METHODS
    if (to := getattr(getattr(implementation, name), "forwards_to", None)) is not None
]


@pytest.mark.parametrize(("implementation", "name", "to"), FORWARDS)
def test_a_forwarded_method_reaches_a_method_of_the_protocols_signature(
    implementation: str, name: str, to: str
) -> None:
    """A method written once (``facade.forward``) calls its collaborator's method of
    the same name with the caller's arguments: that method takes them as the protocol
    writes them."""
    assert shape(getattr(COLLABORATORS[to], name))[0] == shape(getattr(Checkpointer, name))[0]


def test_the_forwards_are_the_collaborators_methods_not_copies() -> None:
    forwarded = {
        name
        for name in METHODS
        if getattr(getattr(CheckpointRepository, name), "forwards_to", None) is not None
    }
    assert {"arun_tool_once", "adelete_user", "aimport_stream", "astats"} <= forwarded
    assert not hasattr(CheckpointRepository.aput_checkpoint, "forwards_to")


SYNC_ONLY = {"setup", "run_tool_once", "iter_threads", "close"}


@pytest.mark.parametrize("implementation", [CheckpointRepository, CachedCheckpointer])
def test_every_async_method_has_a_sync_twin_of_its_signature(implementation: type) -> None:
    """``aput_checkpoint`` -> ``put_checkpoint``, ... (``aimport`` -> ``import_``): the
    same parameters and result, written once (``tenxstore.twins.twin``)."""
    for name in METHODS:
        if not name.startswith("a") or name in ("aenter", "asetup"):
            continue
        sync = "import_" if name == "aimport" else name[1:]
        assert hasattr(implementation, sync), sync
        if sync in SYNC_ONLY:
            continue
        twin = getattr(implementation, sync)
        assert twin.__dict__.get("twin_of") == name
        assert shape(twin) == shape(getattr(Checkpointer, name)), sync


def test_the_memory_stores_sync_twins_keep_their_async_signatures() -> None:
    """``MemoryStore``'s twins are written out (they may run inside a running loop, in
    a helper thread): each takes exactly its async method's parameters, with the same
    defaults, and returns what it returns."""
    from tenxstore.memory.store import MemoryStore
    from tenxstore.memory.sync import SyncTwins

    twins = [name for name, value in vars(SyncTwins).items() if inspect.isfunction(value)]
    assert len(twins) >= 10
    for name in twins:
        if name.startswith("_") or not hasattr(MemoryStore, "a" + name):
            continue
        sync_shape, async_shape = (
            shape(getattr(SyncTwins, name)),
            shape(getattr(MemoryStore, "a" + name)),
        )
        assert [p[:3] for p in sync_shape[0]] == [p[:3] for p in async_shape[0]], name
        assert sync_shape[1].replace("builtins.", "") == async_shape[1], name
