"""``tenxstore demo``: a small simulated agent loop on the embedded SQLite default.

Four runs work on two threads at once. Each step reads the thread, "thinks", appends
its messages and writes; runs that lose a race get ``StaleStateError``, re-read and
retry, so every step lands exactly once. History is pruned to five versions. One run
sends an email through the tool ledger and then crashes before it can record the
step; its resumed run asks for the same tool call and gets the stored result: the
email is not sent twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import StaleStateError
from .presets import SqliteCheckpointer
from .repository import CheckpointRepository

__all__ = ["DemoReport", "run_demo"]

THREADS = ("support-chat", "research-task")
USER = "demo-user"


@dataclass
class DemoReport:
    """What the demo did."""

    path: str
    steps: int = 0
    conflicts: int = 0
    emails_sent: int = 0
    replays: int = 0
    heads: dict[str, int] = field(default_factory=dict)
    retained: dict[str, list[int]] = field(default_factory=dict)
    messages: dict[str, int] = field(default_factory=dict)


class _Crash(Exception):
    """The simulated crash between a tool call and the next checkpoint."""


async def _run(
    cp: Any,
    name: str,
    thread: str,
    steps: int,
    report: DemoReport,
    say: Callable[[str], None],
) -> None:
    for step in range(steps):
        while True:
            config = {"thread_id": thread, "user_id": USER}
            state = await cp.aget_state(config) or {"turns": 0, "log": []}
            await asyncio.sleep(0)  # the model call would be here: others run meanwhile
            state = {"turns": state["turns"] + 1, "log": [*state["log"], f"{name}:{step}"][-5:]}
            message = {"role": "assistant", "content": f"{name} step {step}"}
            try:
                version = await cp.aput_checkpoint(config, state, [message])
            except StaleStateError as exc:
                report.conflicts += 1
                say(
                    f"  {name:<6} {thread:<14} lost a race (read v{exc.expected_version}, "
                    f"thread at v{exc.actual_version}): re-read and retry"
                )
                continue
            report.steps += 1
            say(f"  {name:<6} {thread:<14} wrote v{version}")
            break


async def _email_then_crash(cp: Any, report: DemoReport, say: Callable[[str], None]) -> None:
    config = {"thread_id": "support-chat", "user_id": USER}

    def email(to: str, subject: str) -> dict[str, str]:
        report.emails_sent += 1
        return {"status": "sent", "to": to, "subject": subject}

    args = {"to": "customer@example.com", "subject": "Your refund"}
    try:
        result = await cp.arun_tool_once(config, "call-refund-email", "send_email", args, email)
        say(f"  tool   send_email -> {result['status']}; the run crashes before its checkpoint")
        raise _Crash
    except _Crash:
        pass
    # The run is resumed: the model asks for the same tool call again.
    result = await cp.arun_tool_once(config, "call-refund-email", "send_email", args, email)
    report.replays += 1
    say(f"  resume send_email -> {result['status']} (replayed from the ledger, not sent again)")


async def run_demo(
    path: str = "tenxstore-demo.db",
    say: Callable[[str], None] = print,
    *,
    url: str | None = None,
    schema: str | None = None,
) -> DemoReport:
    """Run the demo on the SQLite file at ``path``, or on the database at ``url``
    (and ``schema``); its demo threads start afresh."""
    if url is None:
        where = str(Path(path).absolute())  # noqa: ASYNC240  # one getcwd()
        cp: Any = SqliteCheckpointer(path, state_history_limit=5)
    else:
        cp = CheckpointRepository(url, schema=schema, state_history_limit=5)
        where = cp.backend.describe() + (f" (schema {schema})" if schema else "")
    report = DemoReport(path=where)
    async with cp:
        await cp.asetup()
        for thread in THREADS:
            await cp.aclean_thread({"thread_id": thread, "user_id": USER})
        say(f"tenxstore demo on {report.path}")
        runs = [_run(cp, f"run-{i}", THREADS[i % 2], 4, report, say) for i in range(4)]
        await asyncio.gather(*runs, _email_then_crash(cp, report, say))
        for thread in THREADS:
            config: dict[str, Any] = {"thread_id": thread, "user_id": USER}
            await cp.aget_state(config)
            report.heads[thread] = config["_checkpoint_version"]
            report.retained[thread] = [s.version for s in await cp.alist_states(config)]
            report.messages[thread] = len(await cp.aget_messages(config))
    return report
