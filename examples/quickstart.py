"""The main job on the embedded SQLite default: a small agent loop, durable at every step.

Three concurrent runs on one thread read the state, "think", and write it back. The
compare-and-swap lets exactly one of them win each round; the others get
StaleStateError, re-read and retry, so no update is lost.

    python examples/quickstart.py [path/to/store.db]
"""

from __future__ import annotations

import asyncio
import sys

from tenxstore import SqliteCheckpointer, StaleStateError


async def run(cp: SqliteCheckpointer, name: str, steps: int) -> int:
    """One agent run: read, think, append a message, write; retry on conflict."""
    conflicts = 0
    for step in range(steps):
        while True:
            config = {"thread_id": "demo-thread", "user_id": "demo-user"}
            state = await cp.aget_state(config) or {"turns": 0, "log": []}
            await asyncio.sleep(0)  # the model call would happen here
            state["turns"] += 1
            state["log"] = [*state["log"], f"{name}:{step}"][-5:]
            message = {"role": "assistant", "content": f"{name} says hello at step {step}"}
            try:
                version = await cp.aput_checkpoint(config, state, [message])
                print(f"  {name} wrote version {version}")
                break
            except StaleStateError as exc:
                conflicts += 1
                seen = f"{exc.expected_version} -> {exc.actual_version}"
                print(f"  {name} lost a race ({seen}); retrying")
    return conflicts


async def main(path: str) -> None:
    async with SqliteCheckpointer(path, state_history_limit=5) as cp:
        await cp.asetup()
        await cp.aclean_thread({"thread_id": "demo-thread", "user_id": "demo-user"})
        conflicts = await asyncio.gather(*(run(cp, f"run-{i}", 4) for i in range(3)))
        config = {"thread_id": "demo-thread", "user_id": "demo-user"}
        state = await cp.aget_state(config)
        history = await cp.alist_states(config)
        messages = await cp.aget_messages(config)
        print(f"\nstore: {path}")
        print(f"head version {config['_checkpoint_version']}, turns {state and state['turns']}")
        print(f"retained versions {[s.version for s in history]} (state_history_limit=5)")
        print(f"messages {len(messages)}, conflicts caught and retried {sum(conflicts)}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "tenxstore.db"))
