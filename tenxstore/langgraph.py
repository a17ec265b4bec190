"""A LangGraph checkpoint saver backed by any tenxstore checkpointer.

``TenxCheckpointSaver(checkpointer)`` is a ``BaseCheckpointSaver`` for async graphs:
checkpoints, namespaces, parents, channel values, metadata and pending writes live in
tenxstore's ``lg_checkpoints`` and ``lg_writes`` tables (values serialized by
LangGraph's serde), on PostgreSQL, SQLite or in memory, behind the cache or not.

Beyond LangGraph's own savers:

* **one writer per parent**: a checkpoint written from a parent that is no longer the
  namespace's newest checkpoint raises :class:`~tenxstore.StaleStateError`, so two runs
  that resumed from the same checkpoint cannot both commit (they would silently fork
  the thread's history otherwise); writes are serialized by the thread's row lock;
* **nothing written after a delete or a replace**: a checkpoint read carries its
  thread's incarnation into the run's writes, which are refused once the thread was
  deleted or replaced since (a parent that no longer exists likewise);
* **bounded history**: ``history_limit`` (default 100) keeps the newest N checkpoints
  per namespace and the heads of branches left at an interrupt; a subgraph's runs
  go with the root checkpoints they ran under (a ``DeltaChannel`` graph's namespace
  is kept whole: its values are rebuilt from the ancestors).

Needs the ``langgraph`` extra. Sync graphs work too (``invoke``, ``get_state``...):
the synchronous methods run the async ones on a background event loop, from any thread
whose own loop is not running (a plain program, or a worker thread of an async
application); from inside a running loop they raise ``RuntimeError`` (use the async
method).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        DeltaChannelHistory,
        PendingWrite,
        get_checkpoint_id,
        get_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("tenxstore.langgraph needs: pip install 'tenxstore[langgraph]'") from exc

from .config import INCARNATION_KEY
from .crypto import CHECKPOINT, WRITE, open_typed
from .errors import ConfigError, SerializationError
from .langgraph_tables import Values, run_id_of
from .loops import BackgroundLoop
from .protocol import Checkpointer
from .serde import decode, encode
from .telemetry import traced
from .types import AuthPolicy
from .validate import check_id, check_text

__all__ = ["DEFAULT_HISTORY_LIMIT", "HEAD_KEY", "TenxCheckpointSaver"]

DEFAULT_HISTORY_LIMIT = 100
"""Checkpoints kept per thread and namespace unless told otherwise: about 25 turns of
a graph that writes four checkpoints a turn."""

HEAD_KEY = "_checkpoint_head"
"""In a config the saver returns: the namespace's newest checkpoint when it was read."""
_SYNC = BackgroundLoop("tenxstore-langgraph")
_FOUND_EMPTY: ContextVar[frozenset[tuple[int, Any, str]]] = ContextVar(
    "tenxstore_langgraph_found_empty", default=frozenset()
)
"""(saver, thread, namespace) this run read as empty: its first checkpoint must find
it empty still (LangGraph writes it from a task that inherits this context)."""


def restore_versions(checkpoint: Checkpoint, versions: str | None) -> None:
    """Put back into a stored checkpoint the channel versions its row's ``versions``
    names (a put leaves them out of the blob); ``""`` marks a value kept inline, whose
    version the blob holds. Rows written before that kept every version in the blob."""
    if versions is None:
        return
    named = {ch: v for ch, v in decode(versions).items() if v != ""}
    checkpoint["channel_versions"] = {**named, **checkpoint["channel_versions"]}


def _configurable(config: RunnableConfig | None) -> dict[str, Any]:
    return dict((config or {}).get("configurable") or {})


def _channel_name(channel: Any, *, nul: bool = True) -> None:
    """A channel's name must be text every table can hold: a str without a lone
    surrogate (and, where it is a column of its own, without U+0000)."""
    if not isinstance(channel, str):
        raise SerializationError(f"a channel name must be a str, not {type(channel).__name__}")
    if not nul and "\x00" in channel:
        raise SerializationError(f"channel {channel!r}: a name with U+0000 cannot be stored")
    if not channel.isascii():
        try:
            channel.encode("utf-8")
        except UnicodeEncodeError:
            raise SerializationError(
                f"channel {channel!r}: a name with a lone surrogate is not valid Unicode"
            ) from None


class TenxCheckpointSaver(BaseCheckpointSaver[str]):
    """LangGraph's ``BaseCheckpointSaver`` on tenxstore.

    LangGraph passes ``adelete_thread``, ``acopy_thread`` and ``aprune`` no config,
    so there is no user to check. Under user isolation those act only with an
    authority the saver was given — bound to one user (``user_id=``, or
    :meth:`for_user`), or an operator ``AuthPolicy`` (``auth_policy=``) — and are
    refused with ``ConfigError`` otherwise: they never act on anyone's thread.

    Args:
        checkpointer: Any tenxstore checkpointer. Its user isolation applies: with
            ``enforce_user_isolation`` on, put ``user_id`` into the run's
            ``configurable`` (or bind the saver to the user).
        serde: LangGraph serializer (default: LangGraph's ``JsonPlusSerializer``).
        history_limit: Checkpoints kept per thread and namespace (None: all). The
            newest ``history_limit`` are kept, with the heads of branches left at an
            interrupt; the rest (and the subgraph runs under it) is pruned when the
            namespace has grown by half the limit since the last prune. A
            ``DeltaChannel`` graph's namespace is kept whole.
        user_id: Act for this user: configs without a ``user_id`` get it, a config
            naming another user is refused, and the config-less calls are scoped to it.
        auth_policy: An ``AuthPolicy`` made by server code that applies to every call
            without one of its own (``AuthPolicy(enforce_user_isolation=False)``: an
            operator's saver, which may delete, copy and prune any thread).
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        *,
        serde: SerializerProtocol | None = None,
        history_limit: int | None = DEFAULT_HISTORY_LIMIT,
        user_id: Any = None,
        auth_policy: AuthPolicy | None = None,
    ) -> None:
        super().__init__(serde=serde)
        if auth_policy is not None and not isinstance(auth_policy, AuthPolicy):
            raise ConfigError(
                f"auth_policy must be an AuthPolicy, not {type(auth_policy).__name__}"
            )
        if user_id is not None:
            user_id = check_id("user_id", user_id, checkpointer.user_id_type)
        self.user_id = user_id
        self.auth_policy = auth_policy
        if history_limit is not None and (
            isinstance(history_limit, bool)
            or not isinstance(history_limit, int)
            or history_limit < 1
        ):
            raise ConfigError(
                f"history_limit must be a positive int or None, not {history_limit!r}"
            )
        self.checkpointer = checkpointer
        self.history_limit = history_limit
        self._tables = checkpointer.langgraph

    def for_user(self, user_id: Any) -> TenxCheckpointSaver:
        """This saver (of the same class), acting for one user (the server's
        authenticated user)."""
        return type(self)(
            self.checkpointer,
            serde=self.serde,
            history_limit=self.history_limit,
            user_id=user_id,
            auth_policy=self.auth_policy,
        )

    def _scoped(self, config: RunnableConfig | None) -> dict[str, Any]:
        """The run config tenxstore reads: LangGraph's ``configurable`` with the saver's
        user and policy filled in where it has none of its own."""
        conf = _configurable(config)
        if self.user_id is not None:
            given = conf.get("user_id")
            if given is None:
                conf["user_id"] = self.user_id
            elif given != self.user_id:
                raise ConfigError(
                    f"this saver acts for user {self.user_id!r}; the config names {given!r}"
                )
        if self.auth_policy is not None and conf.get("auth_policy") is None:
            conf["auth_policy"] = self.auth_policy
        return {"configurable": conf}

    def _authority(self, thread_id: Any, what: str) -> dict[str, Any]:
        """The config of a call LangGraph makes without one, from the saver's authority.

        Raises:
            ConfigError: Isolation applies and the saver has no user and no policy.
        """
        config = self._scoped({"configurable": {"thread_id": thread_id}})
        conf = config["configurable"]
        unbound = conf.get("user_id") is None and conf.get("auth_policy") is None
        if unbound and self.checkpointer.enforce_user_isolation:
            raise ConfigError(
                f"{what} names a thread but no user, and user isolation applies: bind "
                "the saver to the user (saver.for_user(user_id)), or give an operator's "
                "saver auth_policy=AuthPolicy(enforce_user_isolation=False)"
            )
        return config

    # -- versions ----------------------------------------------------------------

    def _dump(self, what: str, value: Any) -> tuple[str, bytes]:
        """LangGraph's serde of a value; one it cannot serialize is ``SerializationError``
        (nothing is written)."""
        try:
            return self.serde.dumps_typed(value)
        except SerializationError:
            raise
        except (TypeError, ValueError, OverflowError) as exc:
            raise SerializationError(f"{what} cannot be serialized: {exc}") from exc

    def get_next_version(self, current: str | None, channel: None = None) -> str:
        """Monotonic string versions, exactly as LangGraph's own savers make them: they
        compare versions as text and continue a channel with 32-digit counters, so a
        thread copied into one of them goes on only with this format (a shorter padding
        would sort after theirs; tests/langgraph/test_storage.py moves a thread out)."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    # -- writes ------------------------------------------------------------------

    @traced(write=True, prefix="langgraph.")
    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint; its parent (``config``'s checkpoint_id) must be the newest.

        Raises:
            StaleStateError: Another writer already committed a checkpoint after the
                parent this one was built on.
        """
        scoped = self._scoped(config)
        conf = scoped["configurable"]
        limits = self._tables.limits
        ns = check_text(
            "checkpoint_ns", conf.get("checkpoint_ns", ""), limits.namespace, empty=True
        )
        parent = conf.get("checkpoint_id")
        if parent is not None:
            check_text("checkpoint_id", parent, limits.checkpoint_id)
        check_text("checkpoint id", checkpoint["id"], limits.checkpoint_id)
        channel_values = checkpoint["channel_values"]
        for channel in (*checkpoint["channel_versions"], *channel_values):
            _channel_name(channel)
        # The values go to lg_blobs, each version once; the checkpoint names them. A
        # name or version longer than the table's key holds (or with U+0000) stays
        # inline. A None value (a branch channel's, say) stays inline too, named by
        # version "" (no row has it): a row of its own would cost ~125 bytes a version.
        versions = {
            ch: "" if channel_values.get(ch, ...) is None else str(v)
            for ch, v in checkpoint["channel_versions"].items()
            if limits.storable(ch, str(v))
        }
        inline = {ch: v for ch, v in channel_values.items() if versions.get(ch, "") == ""}
        # A version the row's ``versions`` names exactly is not stored again in a
        # msgpack blob (restored from it on read; migration 0007 can write it back):
        # ~60 bytes a channel on every checkpoint.
        kept = {
            ch: v
            for ch, v in checkpoint["channel_versions"].items()
            if not (isinstance(v, str) and v != "" and versions.get(ch) == v)
        }
        typed = self._dump(
            "the checkpoint", {**checkpoint, "channel_values": inline, "channel_versions": kept}
        )
        if typed[0] != "msgpack" and len(kept) < len(checkpoint["channel_versions"]):
            typed = self._dump("the checkpoint", {**checkpoint, "channel_values": inline})
        values = Values(
            versions=versions,
            stored=frozenset(ch for ch in channel_values if versions.get(ch, "") != ""),
            new=frozenset(new_versions),
            dump=lambda channel: self._dump(f"channel {channel!r}", channel_values[channel]),
        )
        full_metadata = {  # tenxstore's own config keys are not the run's metadata
            k: v
            for k, v in get_checkpoint_metadata(config, metadata).items()
            if k not in (HEAD_KEY, INCARNATION_KEY)
        }
        meta = encode(full_metadata, "metadata")
        seen = conf.get(HEAD_KEY)
        found_empty = (id(self._tables), conf["thread_id"], ns) in _FOUND_EMPTY.get()
        incarnation = await self._tables.put(
            scoped,
            ns,
            checkpoint["id"],
            parent,
            typed,
            meta,
            self.history_limit,
            seen_head=seen if isinstance(seen, str) else None,
            run_id=run_id_of(full_metadata),
            values=values,
            found_empty=found_empty,
        )
        if found_empty:  # the namespace has a head now: the next first write needs a read
            _FOUND_EMPTY.set(_FOUND_EMPTY.get() - {(id(self._tables), conf["thread_id"], ns)})
        return {
            "configurable": {
                **{k: v for k, v in conf.items() if k == "user_id"},
                "thread_id": conf["thread_id"],
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
                INCARNATION_KEY: incarnation,
                HEAD_KEY: checkpoint["id"],  # this run's own head, from here on
            }
        }

    @traced(write=True, prefix="langgraph.")
    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store the writes a task made against the checkpoint in ``config``."""
        scoped = self._scoped(config)
        conf = scoped["configurable"]
        limits = self._tables.limits
        ns = check_text(
            "checkpoint_ns", conf.get("checkpoint_ns", ""), limits.namespace, empty=True
        )
        check_text("task_id", task_id, limits.task_id, empty=True)
        check_text("task_path", task_path, None, empty=True)
        rows = []
        for index, (channel, value) in enumerate(writes):
            _channel_name(channel, nul=False)
            type_, blob = self._dump(f"a write to channel {channel!r}", value)
            rows.append(
                {
                    "task_id": task_id,
                    "idx": WRITES_IDX_MAP.get(channel, index),
                    "channel": channel,
                    "type": type_,
                    "value": blob,
                    "task_path": task_path,
                }
            )
        await self._tables.put_writes(scoped, ns, conf["checkpoint_id"], rows)

    @traced(write=True, prefix="langgraph.")
    async def adelete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint and write of a thread (and the tenxstore thread).

        Raises:
            ConfigError: Isolation applies and the saver has no authority (see class).
            ThreadOwnershipError: The saver's user does not own the thread.
        """
        config = self._authority(thread_id, "adelete_thread")
        await self.checkpointer.aclean_thread(config["configurable"])

    @traced(write=True, prefix="langgraph.")
    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) of these runs (``run_id`` in their
        metadata), in the threads the saver's authority covers: its user's, or every
        thread for an operator's saver.

        Raises:
            ConfigError: Isolation applies and the saver has no authority (see class).
        """
        if isinstance(run_ids, str) or not all(isinstance(r, str) for r in run_ids):
            raise ConfigError("run_ids must be a sequence of str")
        config = self._scoped(None)
        conf = config["configurable"]
        unbound = conf.get("user_id") is None and conf.get("auth_policy") is None
        if unbound and self.checkpointer.enforce_user_isolation:
            raise ConfigError(
                "adelete_for_runs names no user, and user isolation applies: bind the "
                "saver to the user (saver.for_user(user_id)), or give an operator's saver "
                "auth_policy=AuthPolicy(enforce_user_isolation=False)"
            )
        await self._tables.delete_runs(conf, list(run_ids))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Synchronous :meth:`adelete_for_runs`."""
        _SYNC.run(self.adelete_for_runs(run_ids), "adelete_for_runs")

    @traced(write=True, prefix="langgraph.")
    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep only the newest checkpoint per namespace (``"keep_latest"``), or delete
        every checkpoint (``"delete"``), of each thread (with the saver's authority)."""
        if strategy not in ("keep_latest", "delete"):
            raise ConfigError(f"strategy must be keep_latest or delete, not {strategy!r}")
        configs = [self._authority(t, "aprune") for t in thread_ids]
        await self._tables.prune(configs, keep_latest=strategy == "keep_latest")

    @traced(write=True, prefix="langgraph.")
    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of a thread to another thread id (with the
        saver's authority: a bound user copies its own threads into its own)."""
        await self._tables.copy(
            self._authority(source_thread_id, "acopy_thread"),
            self._authority(target_thread_id, "acopy_thread"),
        )

    # -- reads -------------------------------------------------------------------

    def _config(self, row: Any, checkpoint_id: str) -> RunnableConfig:
        """A config that names a checkpoint and carries what the saver needs to accept
        it back: the owner (under isolation), which life of the thread was read (a
        write after a delete or a replace is refused), and the namespace's head at the
        time of the read (a run resumed from an older checkpoint may fork from there;
        a run that lost a race to another cannot commit)."""
        configurable: dict[str, Any] = {
            "thread_id": row.thread_id,
            "checkpoint_ns": row.checkpoint_ns,
            "checkpoint_id": checkpoint_id,
            INCARNATION_KEY: row.incarnation,
            HEAD_KEY: row.head,
        }
        if row.user_id is not None:
            configurable["user_id"] = row.user_id
        return {"configurable": configurable}

    def _loads(self, kind: str, data: bytes, thread_id: Any, column: str) -> Any:
        """A stored LangGraph value (opened when sealed) through the serde."""
        return self.serde.loads_typed(
            open_typed(self._tables.keys, kind, bytes(data), thread_id, column)
        )

    def _tuple(
        self, row: Any, writes: list[Any], values: Mapping[str, tuple[str, bytes]]
    ) -> CheckpointTuple:
        thread = row.thread_id
        checkpoint: Checkpoint = self._loads(row.type, row.checkpoint, thread, CHECKPOINT)
        restore_versions(checkpoint, row.versions)
        if values:  # kept in lg_blobs (a checkpoint written before 0005 has them inline)
            checkpoint["channel_values"] = {
                **checkpoint["channel_values"],
                **{ch: self.serde.loads_typed(typed) for ch, typed in values.items()},
            }
        config = self._config(row, row.checkpoint_id)
        parent = None
        if row.parent_checkpoint_id is not None:
            parent = self._config(row, row.parent_checkpoint_id)
        return CheckpointTuple(
            config=config,
            checkpoint=checkpoint,
            metadata=decode(row.metadata),
            parent_config=parent,
            pending_writes=[
                (w.task_id, w.channel, self._loads(w.type, w.value, thread, WRITE)) for w in writes
            ],
        )

    @traced(prefix="langgraph.")
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named in ``config``, or the namespace's newest."""
        scoped = self._scoped(config)
        conf = scoped["configurable"]
        ns = conf.get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config)
        rows = await self._tables.rows(scoped, ns, checkpoint_id, None, 1)
        if checkpoint_id is None:  # what this run saw of the namespace's head
            key = (id(self._tables), conf.get("thread_id"), ns)
            seen = _FOUND_EMPTY.get()
            _FOUND_EMPTY.set(seen - {key} if rows else seen | {key})
        return self._tuple(*rows[0]) if rows else None

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints newest first, by thread, namespace, metadata (``filter``, narrowed
        in SQL) and ``before``."""
        scoped = self._scoped(config)
        conf = scoped["configurable"]
        rows = await self._tables.rows(
            scoped,
            conf.get("checkpoint_ns"),
            conf.get("checkpoint_id"),
            get_checkpoint_id(before) if before else None,
            limit,
            metadata=filter or None,
        )
        for row, writes, values in rows:
            yield self._tuple(row, writes, values)

    @traced(prefix="langgraph.")
    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """LangGraph's walk of the parent chain for ``DeltaChannel`` values (beta), read
        a batch of 256 ancestors at a time in one snapshot, only the channels asked for:
        per channel, the writes on the path oldest first, and the nearest stored value
        as the seed."""
        if not channels:
            return {}
        scoped = self._scoped(config)
        conf = scoped["configurable"]
        ns = conf.get("checkpoint_ns", "")
        steps = await self._tables.history(scoped, ns, get_checkpoint_id(config), set(channels))
        thread = self._tables.thread_id_of(scoped)
        collected: dict[str, list[PendingWrite]] = {c: [] for c in channels}
        seeds: dict[str, Any] = {}
        remaining = set(channels)
        for _, writes, values, inline in steps:  # parent first
            if not remaining:
                break
            for w in reversed(writes):
                if w.channel in remaining:
                    collected[w.channel].append(
                        (w.task_id, w.channel, self._loads(w.type, w.value, thread, WRITE))
                    )
            held = {ch: self.serde.loads_typed(typed) for ch, typed in values.items()}
            if inline is not None:  # values kept in the checkpoint itself
                checkpoint = self._loads(inline.type, inline.checkpoint, thread, CHECKPOINT)
                held = {**checkpoint["channel_values"], **held}
            for channel in [c for c in remaining if c in held]:
                seeds[channel] = held[channel]
                remaining.discard(channel)
        result: dict[str, DeltaChannelHistory] = {}
        for channel in channels:
            entry: DeltaChannelHistory = {"writes": list(reversed(collected[channel]))}
            if channel in seeds:
                entry["seed"] = seeds[channel]
            result[channel] = entry
        return result

    # -- the synchronous API: the same calls, run on a background event loop ------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Synchronous :meth:`aget_tuple` (from a thread without a running loop)."""
        return _SYNC.run(self.aget_tuple(config), "aget_tuple")

    def list(  # LangGraph's name
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Synchronous :meth:`alist` (read at once, then iterated)."""

        async def read() -> Sequence[CheckpointTuple]:
            listed = self.alist(config, filter=filter, before=before, limit=limit)
            return [found async for found in listed]

        return iter(_SYNC.run(read(), "alist"))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Synchronous :meth:`aput`."""
        return _SYNC.run(self.aput(config, checkpoint, metadata, new_versions), "aput")

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Synchronous :meth:`aput_writes`."""
        _SYNC.run(self.aput_writes(config, writes, task_id, task_path), "aput_writes")

    def delete_thread(self, thread_id: str) -> None:
        """Synchronous :meth:`adelete_thread`."""
        _SYNC.run(self.adelete_thread(thread_id), "adelete_thread")

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Synchronous :meth:`acopy_thread`."""
        _SYNC.run(self.acopy_thread(source_thread_id, target_thread_id), "acopy_thread")

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Synchronous :meth:`aprune`."""
        _SYNC.run(self.aprune(thread_ids, strategy=strategy), "aprune")

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Synchronous :meth:`aget_delta_channel_history`."""
        work = self.aget_delta_channel_history(config=config, channels=channels)
        return _SYNC.run(work, "aget_delta_channel_history")
