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

Its parts: :mod:`.configs` (the configs read and returned), :mod:`.forms` (what is
stored, and read back), :mod:`.lives` (what a run carries from call to call) and
:mod:`.sync` (the synchronous methods).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from typing import Any

from ..extras import require_extra

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        DeltaChannelHistory,
        get_checkpoint_id,
        get_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
except ImportError:  # MissingExtra (an ImportError) when the extra is not installed
    require_extra(
        "langgraph", "langgraph.checkpoint", "langchain_core", needed_by="tenxstore.langgraph"
    )
    raise  # installed, and still failing: its own error says more than we could

from ..boundary import guard_iter
from ..config import INCARNATION_KEY
from ..crypto import Life, open_typed
from ..errors import ConfigError, MissingThreadId
from ..protocol import Checkpointer
from ..serde import encode
from ..telemetry import traced
from ..types import AuthPolicy
from ..validate import check_id, check_text
from .configs import HEAD_KEY, check_thread, configurable, missing, stored_config, unusable
from .forms import (
    checkpoint_tuple,
    delta_histories,
    dump_typed,
    stored_form,
    write_rows,
)
from .lives import found_empty, lived, run_life, saw_head
from .runs import ainvoke_retrying, idempotent_input, invoke_retrying
from .sync import SyncSaver
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


class TenxCheckpointSaver(SyncSaver):
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

    def scoped(self, config: RunnableConfig | None) -> dict[str, Any]:
        """The run config tenxstore reads: LangGraph's ``configurable`` with the saver's
        user and policy filled in where it has none of its own."""
        conf = configurable(config)
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
        if unusable(thread_id):
            raise MissingThreadId(f"{what} needs a thread id, not {thread_id!r}")
        config = self.scoped({"configurable": {"thread_id": thread_id}})
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

    def dump_value(self, what: str, value: Any) -> tuple[str, bytes]:
        """LangGraph's serde of a value; one it cannot serialize is ``SerializationError``
        (nothing is written)."""
        return dump_typed(self.serde, what, value)

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

    def stored_form(
        self,
        checkpoint: Checkpoint,
        new_versions: ChannelVersions,
        *,
        dump: Callable[[str], tuple[str, bytes]] | None = None,
        keep_inline: Collection[str] = (),
    ) -> tuple[tuple[str, bytes], Values]:
        """How a put stores a checkpoint: its serialized blob and its values (see
        :func:`~tenxstore.langgraph.forms.stored_form`; an import passes ``dump`` and
        ``keep_inline``)."""
        return stored_form(
            self._tables.limits,
            self.dump_value,
            checkpoint,
            new_versions,
            dump=dump,
            keep_inline=keep_inline,
        )

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
        scoped = self.scoped(config)
        conf = scoped["configurable"]
        check_thread(config, conf, "aput")
        limits = self._tables.limits
        ns = check_text(
            "checkpoint_ns", conf.get("checkpoint_ns", ""), limits.namespace, empty=True
        )
        parent = conf.get("checkpoint_id") or None  # "" names none, as LangGraph reads it
        if parent is not None:
            check_text("checkpoint_id", parent, limits.checkpoint_id)
        check_text("checkpoint id", checkpoint["id"], limits.checkpoint_id)
        typed, values = self.stored_form(checkpoint, new_versions)
        full_metadata = {  # tenxstore's own config keys are not the run's metadata
            k: v
            for k, v in get_checkpoint_metadata(config, metadata).items()
            if k not in (HEAD_KEY, INCARNATION_KEY)
        }
        meta = encode(full_metadata, "metadata")
        seen = conf.get(HEAD_KEY)
        empty = found_empty(self._tables, conf["thread_id"], ns)
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
            found_empty=empty,
        )
        if empty:  # the namespace has a head now: the next first write needs a read
            saw_head(self._tables, conf["thread_id"], ns, empty=False)
        lived(self._tables, conf["thread_id"], incarnation, reading=False)
        return stored_config(conf, ns, checkpoint["id"], incarnation)

    @traced(write=True, prefix="langgraph.")
    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store the writes a task made against the checkpoint in ``config``."""
        scoped = self.scoped(config)
        conf = scoped["configurable"]
        check_thread(config, conf, "aput_writes")
        limits = self._tables.limits
        ns = check_text(
            "checkpoint_ns", conf.get("checkpoint_ns", ""), limits.namespace, empty=True
        )
        check_text("task_id", task_id, limits.task_id, empty=True)
        check_text("task_path", task_path, None, empty=True)
        rows = write_rows(self.dump_value, writes, task_id, task_path)
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
        config = self.scoped(None)
        conf = config["configurable"]
        unbound = conf.get("user_id") is None and conf.get("auth_policy") is None
        if unbound and self.checkpointer.enforce_user_isolation:
            raise ConfigError(
                "adelete_for_runs names no user, and user isolation applies: bind the "
                "saver to the user (saver.for_user(user_id)), or give an operator's saver "
                "auth_policy=AuthPolicy(enforce_user_isolation=False)"
            )
        await self._tables.delete_runs(conf, list(run_ids))

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

    def _loads(self, kind: str, data: bytes, thread_id: Any, column: str, life: Life) -> Any:
        """A stored LangGraph value (opened when sealed, for the thread's ``life`` read
        with it) through the serde."""
        return self.serde.loads_typed(
            open_typed(self._tables.keys, kind, bytes(data), thread_id, column, life)
        )

    @traced(prefix="langgraph.")
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named in ``config``, or the namespace's newest."""
        scoped = self.scoped(config)
        conf = scoped["configurable"]
        # Without a thread, the read below would list every thread the user has, and
        # the run would go on in the newest one: never guess a thread.
        check_thread(config, conf, "aget_tuple")
        ns = conf.get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config) or None  # "": the newest, as LangGraph reads it
        rows = await self._tables.rows(scoped, ns, checkpoint_id, None, 1)
        if checkpoint_id is None:  # what this run saw of the namespace's head
            saw_head(self._tables, conf.get("thread_id"), ns, empty=not rows)
        if rows or checkpoint_id is None:  # the life read (None: found empty)
            life = rows[0][0].incarnation if rows else None
            lived(self._tables, conf.get("thread_id"), life, reading=True)
        return checkpoint_tuple(self.serde, self._loads, *rows[0]) if rows else None

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
        scoped = self.scoped(config)
        conf = scoped["configurable"]
        if "thread_id" in conf and unusable(conf["thread_id"]):
            # absent lists every thread the caller may see; None or "" is a mistake
            raise missing(config, "alist")
        rows = await self._tables.rows(
            scoped,
            conf.get("checkpoint_ns"),
            conf.get("checkpoint_id"),
            get_checkpoint_id(before) if before else None,
            limit,
            metadata=filter or None,
        )
        for row, writes, values in rows:
            yield checkpoint_tuple(self.serde, self._loads, row, writes, values)

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
        scoped = self.scoped(config)
        conf = scoped["configurable"]
        check_thread(config, conf, "aget_delta_channel_history")
        ns = conf.get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config) or None
        life, steps = await self._tables.history(scoped, ns, checkpoint_id, set(channels))
        thread = self._tables.thread_id_of(scoped)
        return delta_histories(self.serde, self._loads, thread, life, steps, channels)
