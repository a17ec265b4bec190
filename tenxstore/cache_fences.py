"""What removes or replaces threads, and fences their cache entries.

A delete fences the thread's keys of both isolation modes above the deleted life; an
import fences the keys of each thread that got a new life, for its owner and for the
owner of the life it replaced; erasing a user and pruning idle threads fence each
batch's keys before the batch commits, and roll it back when Redis did not confirm.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar, cast

from .cache_core import CacheCore
from .errors import CacheUnreachable
from .langgraph.values import AllowedTypes
from .lifecycle import BatchHook, DeleteResult
from .protocol import Checkpointer
from .redis_cache import BLANKET, Fence
from .telemetry import traced
from .types import Commit, Imported, ImportOutcome, OnConflict, ThreadExport

__all__ = ["CacheFences"]

_F = TypeVar("_F", bound=Callable[..., Awaitable[Any]])


def _fenced_batches(method: _F) -> _F:
    """The protocol's batched delete ``method`` (``adelete_user``, ``aprune_idle``),
    passed to the wrapped checkpointer with the cache entries of each batch's threads
    fenced before that batch commits (:meth:`CacheFences._fencing`); the result counts
    the keys fenced."""
    name = method.__name__

    @functools.wraps(method)
    async def call(
        self: CacheFences, /, *args: Any, before_commit: BatchHook | None = None, **options: Any
    ) -> DeleteResult:
        fenced = [0]
        hook = self._fencing(before_commit, fenced)
        done: DeleteResult = await getattr(self.inner, name)(*args, before_commit=hook, **options)
        return replace(done, cache_keys=done.cache_keys + fenced[0])

    call.__doc__ = (
        f"{method.__doc__}\n\n        The cache fences the entries of each batch's "
        "threads before that batch commits."
    )
    return cast(_F, traced(write=True)(call))


class CacheFences(CacheCore):
    """Deletes, imports and the data lifecycle of
    :class:`~tenxstore.cache.CachedCheckpointer`."""

    @traced(write=True)
    async def aclean_thread(self, config: dict[str, Any]) -> bool:
        """Delete the thread and its data, then fence its cache entries of both modes.

        After this returns (and Redis answered), no read through the cache returns the
        deleted data, and no refill that read it before the delete can store it.
        """
        return await self.adelete(config) is not None

    @traced(write=True)
    async def adelete(self, config: dict[str, Any]) -> Commit | None:
        """:meth:`aclean_thread`, returning the repository's :class:`Commit`."""
        ids = self._ids(config)
        removed = await self.inner.adelete(config)
        redis = self._redis
        if redis is None:
            return removed
        if removed is None:  # nothing to delete: drop the entries this call's keys hold
            owner = ids.user_id if ids.isolated else None  # (a fence there stays)
            await redis.drop([k for k in await self._keys(ids.thread_id, owner) if k])
            return None
        fence = (removed.incarnation + 1, 0)  # nothing of the deleted life may land
        keys = await self._keys(removed.thread_id, removed.user_id)
        await redis.fence([(key, fence) for key in keys if key is not None])
        return removed

    # -- imports: an import fences the entries of the threads it wrote -----------

    @traced(write=True)
    async def aimport_thread(
        self,
        export: ThreadExport,
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> ImportOutcome:
        """Write an exported thread back (see the repository); when that made a new
        life of the thread, fence its cache entries of both modes."""
        [outcome] = await self.aimport_threads(
            [export], on_conflict=on_conflict, allowed_types=allowed_types
        )
        return outcome

    @traced(write=True)
    async def aimport_threads(
        self,
        exports: Sequence[ThreadExport],
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> list[ImportOutcome]:
        """Write exported threads back in one transaction (see the repository), then
        fence the cache entries of every thread that got a new life."""
        done = await self.aimport(exports, on_conflict=on_conflict, allowed_types=allowed_types)
        return [imported.outcome for imported in done]

    @traced(write=True)
    async def aimport(
        self,
        exports: Sequence[ThreadExport],
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> list[Imported]:
        """:meth:`aimport_threads`, returning what each import did (see
        :meth:`aimport_stream`)."""
        given = list(exports)
        return await self.aimport_stream(
            lambda: ((None, export) for export in given),
            on_conflict=on_conflict,
            allowed_types=allowed_types,
        )

    @traced(write=True)
    async def aimport_stream(
        self,
        source: Callable[[], Iterable[tuple[str | None, ThreadExport]]],
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> list[Imported]:
        """Import exports read twice from ``source`` (see the repository). The entries
        of each imported thread are fenced for its owner and for the owner of the life
        it replaced (who may be another user); a skipped thread's are left alone."""
        done = await self.inner.aimport_stream(
            source, on_conflict=on_conflict, allowed_types=allowed_types
        )
        if self._redis is not None:
            keys: set[str | None] = set()
            for imported in done:
                # "unchanged" too: an import run again re-sends what a lost one did not
                if imported.outcome != "skipped":
                    keys.update(await self._keys(imported.thread_id, imported.user_id))
                if imported.replaced is not None:
                    old = imported.replaced
                    keys.update(await self._keys(old.thread_id, old.user_id))
            fenced = sorted(key for key in keys if key is not None)
            await self._redis.fence([(key, BLANKET) for key in fenced])
        return done

    # -- data lifecycle: each batch fences its threads' entries before it commits -----

    def _fencing(self, then: BatchHook | None, fenced: list[int]) -> BatchHook | None:
        """A ``before_commit`` hook that fences the entries of the threads a batch
        deletes (both modes, above the deleted life, as :meth:`adelete` does), then
        calls ``then``. It runs before the batch commits: no reader can see the rows
        gone while an entry still holds them, and a crash right after the commit
        leaves fences, not entries (a fence lives ``FENCE_SECONDS``; after it, a
        refill finds no row). Unlike a single delete, which fails open, a batch whose
        fences Redis did not confirm is rolled back (:class:`CacheUnreachable`): its
        threads would otherwise be gone with nothing left to say their entries must
        go, and a run again would not find them."""
        redis = self._redis
        if redis is None:
            return then

        async def fence(gone: Sequence[Commit]) -> None:
            fences: list[tuple[str, Fence]] = []
            for removed in gone:
                above = (removed.incarnation + 1, 0)  # nothing of the deleted life may land
                for key in await self._keys(removed.thread_id, removed.user_id):
                    if key is not None:
                        fences.append((key, above))
            if not await redis.fence_many(fences):
                problem = redis.status().last_error or "Redis did not answer in time"
                raise CacheUnreachable(
                    f"the cache entries of {len(gone)} thread(s) could not be fenced "
                    f"({problem}); their batch was rolled back, nothing of it deleted. "
                    "Run the call again once Redis answers: it goes on where it stopped"
                )
            fenced[0] += len(fences)
            if then is not None:
                await then(gone)

        return fence

    adelete_user = _fenced_batches(Checkpointer.adelete_user)

    aprune_idle = _fenced_batches(Checkpointer.aprune_idle)
