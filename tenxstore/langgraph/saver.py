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
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Mapping, Sequence
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
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("tenxstore.langgraph needs: pip install 'tenxstore[langgraph]'") from exc

from ..boundary import guard_iter
from ..config import INCARNATION_KEY
from ..crypto import CHECKPOINT, WRITE, Life, life_of, open_typed
from ..errors import ConfigError, MissingThreadId, SerializationError
from ..loops import LANGGRAPH_LOOP
from ..protocol import Checkpointer
from ..serde import decode, encode
from ..telemetry import traced
from ..types import AuthPolicy
from ..validate import check_id, check_text
from .runs import ainvoke_retrying, idempotent_input, invoke_retrying
from .tables import Values, run_id_of
from .values import AllowedTypes, allowed_set

__all__ = [
    "DEFAULT_HISTORY_LIMIT",
    "HEAD_KEY",
    "TenxCheckpointSaver",
    "ainvoke_retrying",
    "idempotent_input",
    "invoke_retrying",
    "run_life",
]


DEFAULT_HISTORY_LIMIT = 100
"""Checkpoints kept per thread and namespace unless told otherwise: about 25 turns of
a graph that writes four checkpoints a turn."""

HEAD_KEY = "_checkpoint_head"
"""In a config the saver returns: the namespace's newest checkpoint when it was read."""
_SYNC = LANGGRAPH_LOOP
_FOUND_EMPTY: ContextVar[frozenset[tuple[int, Any, str]]] = ContextVar(
    "tenxstore_langgraph_found_empty", default=frozenset()
)
"""(saver, thread, namespace) this run read as empty: its first checkpoint must find
it empty still (LangGraph writes it from a task that inherits this context)."""
_LIVES: ContextVar[dict[tuple[int, Any], int] | None] = ContextVar(
    "tenxstore_langgraph_lives", default=None
)
"""(store, thread) -> the life (incarnation) of the thread this run read or wrote.

One dict per run, made by the run's first read (in the run's own context) and shared
by reference with every context copied from it afterwards: the tasks LangGraph starts,
and the background task that stores its checkpoints (``durability="async"``), whose
put of the run's first checkpoint records the life the tasks then see."""


def _lived(tables: Any, thread_id: Any, incarnation: int | None, *, reading: bool) -> None:
    """Record (or, None, forget) the life of a thread this run read or wrote; a read
    makes the run's dict where there is none yet."""
    lives = _LIVES.get()
    if lives is None:
        if not reading:
            return  # not in a run that read first (a put of LangGraph's own making)
        lives = {}
        _LIVES.set(lives)
    key = (id(tables), thread_id)
    if incarnation is None:
        lives.pop(key, None)
    else:
        lives[key] = incarnation


def run_life(checkpointer: Checkpointer, thread_id: Any) -> int | None:
    """The life (incarnation) of ``thread_id`` that this LangGraph run read or wrote
    through a :class:`TenxCheckpointSaver` on ``checkpointer`` (its tasks inherit the
    run's context), or None: the run has not read it, or found it empty."""
    lives = _LIVES.get()
    return None if lives is None else lives.get((id(checkpointer.langgraph), thread_id))


def _config_life(tables: Any, config: Any, *, reading: bool) -> None:
    """After a synchronous call (its async twin ran on the background loop, in a
    context of its own): the life its returned config names, in the caller's run."""
    conf = (config or {}).get("configurable") or {}
    if conf.get("thread_id") is not None and conf.get(INCARNATION_KEY) is not None:
        _lived(tables, conf["thread_id"], conf[INCARNATION_KEY], reading=reading)


def restore_versions(checkpoint: Checkpoint, versions: str | None) -> None:
    """Put back into a stored checkpoint the channel versions its row's ``versions``
    names (a put leaves them out of the blob); ``""`` marks a value kept inline, whose
    version the blob holds. Rows written before that kept every version in the blob."""
    if versions is None:
        return
    named = {ch: v for ch, v in decode(versions).items() if v != ""}
    checkpoint["channel_versions"] = {**named, **checkpoint["channel_versions"]}


def _configurable(config: RunnableConfig | None) -> dict[str, Any]:
    if config is not None and not isinstance(config, Mapping):
        raise ConfigError(f"config must be a dict, not {type(config).__name__}")
    inner = (config or {}).get("configurable") or {}
    if not isinstance(inner, Mapping):
        raise ConfigError(f"config['configurable'] must be a dict, not {type(inner).__name__}")
    return dict(inner)


def _unusable(thread_id: Any) -> bool:
    """No thread named: absent, None or empty."""
    return thread_id is None or thread_id == ""


def _missing(config: Any, what: str) -> MissingThreadId:
    """The error of a call that acts on a thread and names none, saying where a thread
    id was given that LangGraph does not read (the top level, or the metadata)."""
    config = config or {}
    metadata = config.get("metadata")
    hint = ""
    if not _unusable(config.get("thread_id")):
        hint = "; config['thread_id'] is not where LangGraph reads it"
    elif isinstance(metadata, Mapping) and not _unusable(metadata.get("thread_id")):
        hint = "; config['metadata']['thread_id'] is not where LangGraph reads it"
    return MissingThreadId(
        f"{what} needs a thread: the config has no config['configurable']['thread_id']"
        f"{hint} (graph.invoke(input, {{'configurable': {{'thread_id': ...}}}}))"
    )


def _check_thread(config: Any, conf: Mapping[str, Any], what: str) -> None:
    """A call that acts on one thread: its ``configurable`` must name it (before any I/O)."""
    if _unusable(conf.get("thread_id")):
        raise _missing(config, what)


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
        serde: LangGraph serializer. The default is LangGraph's ``JsonPlusSerializer``
            in its strict mode: a stored value opens only as LangGraph's safe types
            (messages, documents, its own types, datetimes...) and the types in
            ``allowed_types`` — never as a callable a stored value names (a
            permissive serde imports and calls whatever a value names: whoever can
            write a row could run code). An unlisted type comes back as its plain
            data, with LangGraph's warning. With ``LANGGRAPH_STRICT_MSGPACK=true``,
            LangGraph adds a compiled graph's own state types itself.
        allowed_types: Types of your own that values may hold, for the default
            serde: classes or ``(module, name)`` pairs.
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
        allowed_types: AllowedTypes = (),
    ) -> None:
        allowed = allowed_set(allowed_types)
        if serde is None:
            strict = JsonPlusSerializer(allowed_msgpack_modules=None)
            serde = strict.with_msgpack_allowlist(allowed) if allowed else strict
        elif allowed:
            raise ConfigError(
                "allowed_types is for the default serde; give your own serde its allow-list"
            )
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
        if _unusable(thread_id):
            raise MissingThreadId(f"{what} needs a thread id, not {thread_id!r}")
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

    def _stored_form(
        self,
        checkpoint: Checkpoint,
        new_versions: ChannelVersions,
        *,
        dump: Callable[[str], tuple[str, bytes]] | None = None,
        keep_inline: Collection[str] = (),
    ) -> tuple[tuple[str, bytes], Values]:
        """How a put stores a checkpoint: its serialized blob (without the values
        kept in ``lg_blobs``, nor the versions its row names) and its values.

        ``dump`` serializes a channel's value (default: the serde); ``keep_inline``
        channels stay in the checkpoint whatever their name and version (an import
        uses both: a value read from another saver is kept as it was written).
        """
        limits = self._tables.limits
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
            if limits.storable(ch, str(v)) and ch not in keep_inline
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
            dump=dump
            or (lambda channel: self._dump(f"channel {channel!r}", channel_values[channel])),
        )
        return typed, values

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
        _check_thread(config, conf, "aput")
        limits = self._tables.limits
        ns = check_text(
            "checkpoint_ns", conf.get("checkpoint_ns", ""), limits.namespace, empty=True
        )
        parent = conf.get("checkpoint_id") or None  # "" names none, as LangGraph reads it
        if parent is not None:
            check_text("checkpoint_id", parent, limits.checkpoint_id)
        check_text("checkpoint id", checkpoint["id"], limits.checkpoint_id)
        typed, values = self._stored_form(checkpoint, new_versions)
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
        _lived(self._tables, conf["thread_id"], incarnation, reading=False)
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
        _check_thread(config, conf, "aput_writes")
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
        checkpoint_id = check_text("checkpoint_id", conf.get("checkpoint_id"), limits.checkpoint_id)
        await self._tables.put_writes(scoped, ns, checkpoint_id, rows)

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
        if isinstance(thread_ids, (str, bytes)):  # a str is a sequence of one-letter ids
            raise ConfigError("thread_ids must be a sequence of thread ids, not one str")
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

    def _loads(self, kind: str, data: bytes, thread_id: Any, column: str, life: Life) -> Any:
        """A stored LangGraph value (opened when sealed, for the thread's ``life`` read
        with it) through the serde."""
        return self.serde.loads_typed(
            open_typed(self._tables.keys, kind, bytes(data), thread_id, column, life)
        )

    def _tuple(
        self, row: Any, writes: list[Any], values: Mapping[str, tuple[str, bytes]]
    ) -> CheckpointTuple:
        thread, life = row.thread_id, life_of(row)
        checkpoint: Checkpoint = self._loads(row.type, row.checkpoint, thread, CHECKPOINT, life)
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
                (w.task_id, w.channel, self._loads(w.type, w.value, thread, WRITE, life))
                for w in writes
            ],
        )

    @traced(prefix="langgraph.")
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named in ``config``, or the namespace's newest."""
        scoped = self._scoped(config)
        conf = scoped["configurable"]
        # Without a thread, the read below would list every thread the user has, and
        # the run would go on in the newest one: never guess a thread.
        _check_thread(config, conf, "aget_tuple")
        ns = conf.get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config) or None  # "": the newest, as LangGraph reads it
        rows = await self._tables.rows(scoped, ns, checkpoint_id, None, 1)
        if checkpoint_id is None:  # what this run saw of the namespace's head
            key = (id(self._tables), conf.get("thread_id"), ns)
            seen = _FOUND_EMPTY.get()
            _FOUND_EMPTY.set(seen - {key} if rows else seen | {key})
        if rows or checkpoint_id is None:  # the life read (None: found empty)
            life = rows[0][0].incarnation if rows else None
            _lived(self._tables, conf.get("thread_id"), life, reading=True)
        return self._tuple(*rows[0]) if rows else None

    @guard_iter
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
        if "thread_id" in conf and _unusable(conf["thread_id"]):
            # absent lists every thread the caller may see; None or "" is a mistake
            raise _missing(config, "alist")
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
        _check_thread(config, conf, "aget_delta_channel_history")
        ns = conf.get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config) or None
        life, steps = await self._tables.history(scoped, ns, checkpoint_id, set(channels))
        thread = self._tables.thread_id_of(scoped)
        collected: dict[str, list[PendingWrite]] = {c: [] for c in channels}
        seeds: dict[str, Any] = {}
        remaining = set(channels)
        for _, writes, values, inline in steps:  # parent first
            if not remaining:
                break
            assert life is not None  # (read with the steps, in the same snapshot)
            for w in reversed(writes):
                if w.channel in remaining:
                    collected[w.channel].append(
                        (w.task_id, w.channel, self._loads(w.type, w.value, thread, WRITE, life))
                    )
            held = {ch: self.serde.loads_typed(typed) for ch, typed in values.items()}
            if inline is not None:  # values kept in the checkpoint itself
                checkpoint = self._loads(inline.type, inline.checkpoint, thread, CHECKPOINT, life)
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
        found = _SYNC.run(self.aget_tuple(config), "aget_tuple")
        if found is not None:
            _config_life(self._tables, found.config, reading=True)
        return found

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
        stored = _SYNC.run(self.aput(config, checkpoint, metadata, new_versions), "aput")
        _config_life(self._tables, stored, reading=False)
        return stored

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
