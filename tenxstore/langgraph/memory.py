"""The documents' agent memory: ``MemoryConfig(store=store)`` for a LangGraph agent.

"Post-load retrieval, 5 results and a score threshold of 0, with a user-scoped memory
tool on and an agent-scoped one off":

* **retrieval** — once the thread's state is loaded, :meth:`MemoryConfig.aretrieve`
  searches the run's user's memories for the run's input (its last user message) and
  :meth:`MemoryConfig.aprompt` gives them as text for the system prompt;
* **tools** — :func:`memory_tools` (or :meth:`MemoryConfig.tools`): LangChain tools the
  model calls to save, search and delete the user's memories (``("memories",)`` of the
  run's user, the documents' default namespace), and, when ``agent_scoped_tool`` is
  on, to save and search the agent's own (``("agents", agent_id)``, shared by every
  user of the agent: off by default, since one user's words then reach another's
  prompt).

Every call is the run's user's, as :meth:`TenxStore.owner` finds it (the tools read
it from the config LangGraph gives them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool

from ..errors import ConfigError
from ..memory.mem0 import Mem0Store
from ..memory.store import MemoryStore
from ..memory.sync import blocking as run_blocking
from ..memory.validation import (
    DEFAULT_NAMESPACE,
    check_namespace,
    check_search_limit,
    check_threshold,
    shared_access,
)
from ..types import MemoryHit
from ..validate import check_bool, check_text
from .store import SCOPED, TenxStore, run_config, shared_owner

__all__ = ["MemoryConfig", "format_memories", "memory_tools", "query_of"]

AGENTS = "agents"
"""The first label of an agent's own namespace: ``("agents", agent_id)``."""


def _text(message: Any) -> str | None:
    """The text of a message (a LangChain message, a ``(role, text)`` pair, a dict)."""
    content: Any
    if isinstance(message, BaseMessage):
        content = message.content
    elif isinstance(message, tuple) and len(message) == 2:
        content = message[1]
    elif isinstance(message, Mapping):
        content = message.get("content")
    else:
        content = message
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks: their text
        parts = [p if isinstance(p, str) else p.get("text") for p in content]
        return " ".join(p for p in parts if isinstance(p, str))
    return None


def _from_user(message: Any) -> bool:
    if isinstance(message, BaseMessage):
        return message.type == "human"
    role = message[0] if isinstance(message, tuple) else None
    if isinstance(message, Mapping):
        role = message.get("role") or message.get("type")
    return role in ("user", "human")


def query_of(input: Any) -> str:
    """What a run's input asks, as a search query: a str as it is; a message, a list
    of messages or a state with ``messages``: the last user message's text.

    Raises:
        ConfigError: An input with no text to search for.
    """
    if isinstance(input, Mapping) and "messages" in input:
        input = input["messages"]
    if isinstance(input, Sequence) and not isinstance(input, (str, tuple)):
        messages = list(input)
        users = [m for m in messages if _from_user(m)]
        input = (users or messages or [""])[-1]
    text = _text(input)
    if text is None:
        raise ConfigError(f"no text to search memories for in {type(input).__name__}")
    return text


def format_memories(hits: Sequence[MemoryHit]) -> str:
    """Memories as a paragraph for a system prompt ("" when there are none)."""
    if not hits:
        return ""
    lines = [f"- [{h.memory.key}] {h.memory.content}" for h in hits]
    return "Long-term memories from earlier conversations (they may be out of date):\n" + (
        "\n".join(lines)
    )


class MemoryConfig:
    """The documents' agent memory over a :class:`TenxStore` (or a ``MemoryStore``).

    Args:
        store: The store given to ``graph.compile(store=...)``: a ``TenxStore``, or the
            ``MemoryStore`` (or :class:`~tenxstore.memory.Mem0Store`) under it.
        limit: Memories a retrieval returns, at most (0 to 10000).
        score_threshold: The least score (0 to 1) a retrieved memory has.
        user_scoped_tool: Give the model tools for the user's memories.
        agent_scoped_tool: Give the model tools for the agent's own memories, shared by
            every user of the agent (retrieval then includes them).
        agent_id: The agent's name for its namespace; None: the run's ``assistant_id``
            or ``graph_id`` (as LangGraph's server sets them), needed only when the
            agent's memories are used.
        namespace: The user's memories' namespace (the documents' default).

    Raises:
        ConfigError: An invalid argument.
    """

    def __init__(
        self,
        store: TenxStore | MemoryStore | Mem0Store,
        *,
        limit: int = 5,
        score_threshold: float = 0.0,
        user_scoped_tool: bool = True,
        agent_scoped_tool: bool = False,
        agent_id: str | None = None,
        namespace: tuple[str, ...] = DEFAULT_NAMESPACE,
    ) -> None:
        if isinstance(store, (MemoryStore, Mem0Store)):
            store = TenxStore(store)
        if not isinstance(store, TenxStore):
            raise ConfigError(
                "MemoryConfig takes a TenxStore, a MemoryStore or a Mem0Store, not "
                f"{type(store).__name__}"
            )
        self.store = store
        self.limit = check_search_limit(limit)
        self.score_threshold = check_threshold(score_threshold)
        self.user_scoped_tool = check_bool("user_scoped_tool", user_scoped_tool)
        self.agent_scoped_tool = check_bool("agent_scoped_tool", agent_scoped_tool)
        self.agent_id = None if agent_id is None else check_text("agent_id", agent_id)
        check_namespace(namespace)
        self.namespace = tuple(namespace)

    @property
    def memory_store(self) -> MemoryStore | Mem0Store:
        """The memories' store."""
        return self.store.memory_store

    def agent_namespace(self, config: Mapping[str, Any] | None = None) -> tuple[str, ...]:
        """The agent's own namespace, ``("agents", agent_id)``.

        Raises:
            ConfigError: No ``agent_id`` was given and the run names no assistant or
                graph.
        """
        agent = self.agent_id
        if agent is None:
            config = run_config() if config is None else config
            conf = dict(config or {})
            places = [conf.get("configurable") or {}, conf.get("metadata") or {}]
            for place in places:
                agent = place.get("assistant_id") or place.get("graph_id")
                if agent:
                    break
        if not agent:
            raise ConfigError(
                "the agent's memories need its name: MemoryConfig(..., agent_id='my-agent')"
            )
        namespace = (AGENTS, str(agent))
        check_namespace(namespace)
        return namespace

    def _agent_owner(self) -> Any:
        return shared_owner(self.store._kind)

    # -- post-load retrieval ---------------------------------------------------------

    async def aretrieve(
        self, input: Any, config: Mapping[str, Any] | None = None
    ) -> list[MemoryHit]:
        """The run's user's memories that best match ``input`` (see :func:`query_of`):
        at most ``limit``, scores at least ``score_threshold``, best first (with the
        agent's own too when ``agent_scoped_tool`` is on).

        Args:
            input: The run's input or state, a message list, or a str.
            config: The run config; None: the LangGraph run's, as the store finds it.
        """
        query = query_of(input)
        store = self.memory_store
        owner = self.store.owner(config)
        with self.store.acting_for(owner):
            hits = await store.asearch(
                owner,
                query,
                namespace=self.namespace,
                limit=self.limit,
                score_threshold=self.score_threshold,
                auth_policy=SCOPED,
            )
        if self.agent_scoped_tool:
            namespace = self.agent_namespace(config)
            with shared_access():  # the agent's memories: no user's
                hits += await store.asearch(
                    self._agent_owner(),
                    query,
                    namespace=namespace,
                    limit=self.limit,
                    score_threshold=self.score_threshold,
                    auth_policy=SCOPED,
                )
            hits.sort(key=lambda h: -h.score)  # stable: the user's first among equals
        return hits[: self.limit]

    def retrieve(self, input: Any, config: Mapping[str, Any] | None = None) -> list[MemoryHit]:
        """Synchronous :meth:`aretrieve`."""
        config = self._config_here(config)
        return run_blocking(self.aretrieve(input, config), "aretrieve")

    async def aprompt(self, input: Any, config: Mapping[str, Any] | None = None) -> str:
        """:meth:`aretrieve` as text for the system prompt ("" when nothing matched)."""
        return format_memories(await self.aretrieve(input, config))

    def prompt(self, input: Any, config: Mapping[str, Any] | None = None) -> str:
        """Synchronous :meth:`aprompt`."""
        return format_memories(self.retrieve(input, config))

    @staticmethod
    def _config_here(config: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        """The run's config read in the calling thread (the work runs in another)."""
        return run_config() if config is None else config

    # -- tools -------------------------------------------------------------------

    def tools(self) -> list[BaseTool]:
        """The memory tools the configuration turns on (see :func:`memory_tools`)."""
        tools: list[BaseTool] = []
        if self.user_scoped_tool:
            tools += _user_tools(self)
        if self.agent_scoped_tool:
            tools += _agent_tools(self)
        return tools


def memory_tools(memory: MemoryConfig | TenxStore | MemoryStore, **options: Any) -> list[BaseTool]:
    """LangChain tools for an agent's memories: ``save_memory``, ``search_memory`` and
    ``delete_memory`` (the run's user's), and with ``agent_scoped_tool=True``
    ``save_agent_memory`` and ``search_agent_memory`` (the agent's, shared by its users).

    Args:
        memory: A :class:`MemoryConfig`, or a store to make one of with ``options``.
        **options: :class:`MemoryConfig`'s arguments (with a store only).
    """
    if not isinstance(memory, MemoryConfig):
        memory = MemoryConfig(memory, **options)
    elif options:
        raise ConfigError("options are for a store: a MemoryConfig has its own")
    return memory.tools()


def _found(hits: Sequence[MemoryHit]) -> str:
    if not hits:
        return "No memories found."
    return "\n".join(f"- [{h.memory.key}] {h.memory.content} (score {h.score:.2f})" for h in hits)


def _user_tools(memory: MemoryConfig) -> list[BaseTool]:
    store = memory.memory_store

    async def asave(content: str, config: RunnableConfig, key: str | None = None) -> str:
        owner = memory.store.owner(config)
        with memory.store.acting_for(owner):
            made = await store.astore(owner, content, namespace=memory.namespace, key=key)
        return f"Saved memory {made.key}."

    async def asearch(query: str, config: RunnableConfig) -> str:
        owner = memory.store.owner(config)
        with memory.store.acting_for(owner):
            found = await store.asearch(
                owner,
                query,
                namespace=memory.namespace,
                limit=memory.limit or 5,
                score_threshold=memory.score_threshold,
                auth_policy=SCOPED,
            )
        return _found(found)

    async def adelete(key: str, config: RunnableConfig) -> str:
        owner = memory.store.owner(config)
        with memory.store.acting_for(owner):
            deleted = await store.adelete(owner, key, namespace=memory.namespace)
        if deleted:
            return f"Deleted memory {key}."
        return f"No memory {key} to delete."

    # the sync twins (a sync graph's tools) run the same bodies on tenxstore's loop
    def save(content: str, config: RunnableConfig, key: str | None = None) -> str:
        return run_blocking(asave(content, config, key), "save_memory")

    def search(query: str, config: RunnableConfig) -> str:
        return run_blocking(asearch(query, config), "search_memory")

    def delete(key: str, config: RunnableConfig) -> str:
        return run_blocking(adelete(key, config), "delete_memory")

    return [
        _tool(
            "save_memory",
            "Save a fact about the user to long-term memory, for later conversations "
            "(a preference, their circumstances, something they asked you to remember). "
            "Give key= (from search_memory) to replace a memory that changed.",
            save,
            asave,
        ),
        _tool(
            "search_memory", "Search the user's long-term memories by keywords.", search, asearch
        ),
        _tool("delete_memory", "Forget one of the user's memories (its key).", delete, adelete),
    ]


def _agent_tools(memory: MemoryConfig) -> list[BaseTool]:
    store = memory.memory_store

    async def asave(content: str, config: RunnableConfig, key: str | None = None) -> str:
        namespace = memory.agent_namespace(config)
        with shared_access():  # the agent's memories: no user's
            made = await store.astore(memory._agent_owner(), content, namespace=namespace, key=key)
        return f"Saved agent memory {made.key}."

    async def asearch(query: str, config: RunnableConfig) -> str:
        namespace = memory.agent_namespace(config)
        with shared_access():  # the agent's memories: no user's
            found = await store.asearch(
                memory._agent_owner(),
                query,
                namespace=namespace,
                limit=memory.limit or 5,
                score_threshold=memory.score_threshold,
                auth_policy=SCOPED,
            )
        return _found(found)

    def save(content: str, config: RunnableConfig, key: str | None = None) -> str:
        return run_blocking(asave(content, config, key), "save_agent_memory")

    def search(query: str, config: RunnableConfig) -> str:
        return run_blocking(asearch(query, config), "search_agent_memory")

    return [
        _tool(
            "save_agent_memory",
            "Save something you learned that helps with every user of this agent (how a "
            "task is best done). Every user's conversations see it: never save anything "
            "personal or private here.",
            save,
            asave,
        ),
        _tool("search_agent_memory", "Search what you learned across all users.", search, asearch),
    ]


def _tool(name: str, description: str, func: Any, coroutine: Any) -> BaseTool:
    return StructuredTool.from_function(
        func=func, coroutine=coroutine, name=name, description=description
    )
