"""Running a LangGraph graph again after another run committed first, losing nothing.

Two runs of one thread that start together both read its head; the saver lets one
commit and refuses the other (:class:`~tenxstore.StaleStateError`). The refused run
may have committed its first checkpoints already — its input among them — and the
run that won may have built on them: the winner then answered with the loser's
message in its context. Sending the loser's input again as it was would store its
message twice; not sending it would lose it when the winner had not taken it in.

The way out is an input that is idempotent: every message carries its id from the
first try on, and LangGraph's ``add_messages`` replaces a message it already holds
(same id) instead of appending it again. :func:`ainvoke_retrying` gives every
message of the input its id once, then runs the graph, and on ``StaleStateError``
runs it again — on the state read anew, after a short random wait that grows with
each refusal — with the very same input: each message is
in the thread once, whichever run stored it. Input to a channel that would add what
it is given a second time (``operator.add`` lists, topics) cannot be made so, and is
refused before the first try; input to a last-value channel is idempotent already.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Collection, Mapping
from typing import Any

from ..errors import ConfigError, StaleStateError

__all__ = ["DEFAULT_ATTEMPTS", "ainvoke_retrying", "idempotent_input", "invoke_retrying"]

DEFAULT_ATTEMPTS = 12
"""Tries of one input before the refusal is raised."""
_FIRST_WAIT = 0.005
_LONGEST_WAIT = 2.0


def _backoff(attempt: int, took: float) -> float:
    """Seconds to wait before try ``attempt + 1``: a random share of a window that
    doubles from 5 ms — or from the time the try took, when that is longer — up to
    2 s, so runs that were refused together do not meet again (each try reads the
    thread and runs the graph again: a lockstep would starve; runs slower than the
    window, on a loaded machine or behind a pooler, met again every time)."""
    window = max(_FIRST_WAIT, took) * 2 ** (attempt - 1)
    return random.uniform(0, min(_LONGEST_WAIT, window))


# The modules of LangGraph's message reducers, which keep one message per id:
# add_messages (a BinaryOperatorAggregate's operator) and the DeltaChannel's.
_MESSAGE_REDUCERS = frozenset(("langgraph.graph.message", "langgraph.pregel._messages"))


def _adds_messages(channel: Any) -> bool:
    """A channel whose reducer is LangGraph's ``add_messages`` (which keeps one message
    per id), plain or as a ``DeltaChannel``."""
    reducer = getattr(channel, "operator", None) or getattr(channel, "reducer", None)
    return getattr(reducer, "__module__", None) in _MESSAGE_REDUCERS


def _idempotent_already(channel: Any) -> bool:
    """A channel that keeps the last value it is given: the same value again is no
    change."""
    from langgraph.channels import (
        AnyValue,
        EphemeralValue,
        LastValue,
        LastValueAfterFinish,
        UntrackedValue,
    )

    kinds = (LastValue, LastValueAfterFinish, EphemeralValue, AnyValue, UntrackedValue)
    return isinstance(channel, kinds)


def _with_ids(value: Any) -> Any:
    """Messages (alone or in a list, in any form ``add_messages`` takes) as message
    objects that carry an id: copies, so the caller's objects are not changed."""
    from langchain_core.messages import BaseMessage, convert_to_messages

    def one(message: BaseMessage) -> BaseMessage:
        if message.id:
            return message
        return message.model_copy(update={"id": str(uuid.uuid4())})

    if isinstance(value, list):
        return [one(m) for m in convert_to_messages(value)]
    return one(convert_to_messages([value])[0])


def idempotent_input(graph: Any, input: Any, messages: Collection[str] = ()) -> Any:
    """The input of a run made safe to send again: each message given its id.

    Args:
        graph: The compiled graph (its channels say what each input key feeds).
        input: A dict of channel values, or None / a ``Command`` (which resume a run:
            returned as they are).
        messages: Keys whose channel keeps one message per id with a reducer of your
            own (one built on ``add_messages``); LangGraph's own are known.

    Raises:
        ConfigError: A key feeds a channel that would add its value again (say so in
            your state: a message list under ``add_messages``, or a last-value key),
            or the input is neither a dict nor None nor a Command.
    """
    from langgraph.types import Command

    if input is None or isinstance(input, Command):
        return input
    if not isinstance(input, Mapping):
        raise ConfigError(
            f"a run's input to send again must be a dict of channel values, not "
            f"{type(input).__name__}"
        )
    channels = getattr(graph, "channels", {})
    prepared: dict[str, Any] = {}
    for key, value in input.items():
        channel = channels.get(key)
        if channel is not None and (key in messages or _adds_messages(channel)):
            prepared[key] = _with_ids(value)
        elif channel is None or _idempotent_already(channel):
            prepared[key] = value  # not a channel (the graph refuses it) or last-value
        else:
            raise ConfigError(
                f"input {key!r} goes to a {type(channel).__name__} that adds what it is "
                "given: sent again after another run took it in, it would be there twice. "
                "Keep such data in a message list (add_messages keeps one message per id) "
                "or in a last-value key"
            )
    return prepared


async def ainvoke_retrying(
    graph: Any,
    input: Any,
    config: Any,
    *,
    attempts: int = DEFAULT_ATTEMPTS,
    messages: Collection[str] = (),
    **kwargs: Any,
) -> Any:
    """``graph.ainvoke``, run again when another run of the thread committed first.

    Every message of the input gets its id before the first try (see
    :func:`idempotent_input`), and each try sends the same input: LangGraph keeps one
    message per id, so the thread holds each message once — whether this run stored
    it, or a run that committed first took it in — and none is lost.

    Args:
        graph: A compiled graph whose checkpointer is a ``TenxCheckpointSaver``.
        input: Its input (a dict; None or a ``Command`` to resume).
        config: The run config (with ``configurable.thread_id``).
        attempts: Tries before the last ``StaleStateError`` is raised (at least 1).
        messages: Keys of message lists under a reducer of your own that keeps one
            message per id (see :func:`idempotent_input`).
        **kwargs: Passed to ``ainvoke``.

    Raises:
        StaleStateError: Every try was refused.
        ConfigError: The input cannot be made safe to send again, or ``attempts`` < 1.
    """
    prepared = _prepared(graph, input, attempts, messages)
    for attempt in range(1, attempts + 1):
        started = time.monotonic()
        try:
            return await graph.ainvoke(prepared, config, **kwargs)
        except StaleStateError:
            if attempt == attempts:
                raise
        await asyncio.sleep(_backoff(attempt, time.monotonic() - started))
    raise AssertionError("unreachable")  # pragma: no cover


def invoke_retrying(
    graph: Any,
    input: Any,
    config: Any,
    *,
    attempts: int = DEFAULT_ATTEMPTS,
    messages: Collection[str] = (),
    **kwargs: Any,
) -> Any:
    """Synchronous :func:`ainvoke_retrying` (``graph.invoke``)."""
    prepared = _prepared(graph, input, attempts, messages)
    for attempt in range(1, attempts + 1):
        started = time.monotonic()
        try:
            return graph.invoke(prepared, config, **kwargs)
        except StaleStateError:
            if attempt == attempts:
                raise
        time.sleep(_backoff(attempt, time.monotonic() - started))
    raise AssertionError("unreachable")  # pragma: no cover


def _prepared(graph: Any, input: Any, attempts: int, messages: Collection[str]) -> Any:
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ConfigError(f"attempts must be an int of at least 1, not {attempts!r}")
    if isinstance(messages, str):
        raise ConfigError("messages is a collection of keys, not one str")
    return idempotent_input(graph, input, messages)
