"""A Redis master, its replica and three sentinels on loopback, to fail over.

Shared by the tests (the pytest rule for a missing ``redis-server`` is theirs: see
:func:`tests.services.require_path`). Every server runs with ``--save ""
--appendonly no`` in a directory of its own under the one given; the sentinels detect
a dead master within :data:`DOWN_AFTER_MS` and may take :data:`FAILOVER_TIMEOUT_MS`
per attempt, so a failover takes one to three seconds. Every wait polls a condition
with a deadline; nothing sleeps to synchronise.
"""

from __future__ import annotations

import atexit
import contextlib
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import redis

from tests.servers import free_port, wait_for_port

__all__ = ["REDIS_SERVER", "SERVICE", "SentinelSet", "poll"]

REDIS_SERVER = "/usr/bin/redis-server"
SERVICE = "mymaster"
DOWN_AFTER_MS = 500
FAILOVER_TIMEOUT_MS = 3000
WAIT = 30.0  # seconds: every wait for a condition, generous for a loaded 2-core machine


def poll(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Return once ``condition()`` is true (an exception counts as false); raise
    ``TimeoutError`` naming ``what`` when it is still false after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(redis.RedisError, OSError):
            if condition():
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: still not so after {timeout:.0f} s")
        time.sleep(0.02)  # polling a condition, not waiting for one


def binary() -> str:
    """The redis-server program (``/usr/bin/redis-server``, else the one on PATH)."""
    found = REDIS_SERVER if Path(REDIS_SERVER).exists() else shutil.which("redis-server")
    if found is None:
        raise FileNotFoundError(REDIS_SERVER)
    return found


class SentinelSet:
    """Nodes ``a`` (the first master) and ``b`` (its replica), and three sentinels that
    watch them as :data:`SERVICE` with a quorum of two.

    ``master()`` is the node the sentinels name; ``client(name)`` a client of a node;
    ``kill(name)`` a crash; ``failover()`` Sentinel's ``SENTINEL FAILOVER``;
    ``wait_master(name)`` waits until every sentinel names ``name`` and it takes writes.
    ``stop()`` ends everything; it also runs at interpreter exit.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        ports = set()
        while len(ports) < 5:
            ports.add(free_port())
        a, b, *watchers = sorted(ports)
        self.ports = {"a": a, "b": b}
        self.sentinel_ports = watchers
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        atexit.register(self.stop)

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        """The sentinels as ``CachedCheckpointer(sentinels=...)`` takes them."""
        return [("127.0.0.1", port) for port in self.sentinel_ports]

    def _start(self, name: str, port: int, *args: str) -> None:
        home = self.directory / name
        home.mkdir(parents=True, exist_ok=True)
        command = [binary(), *args, "--port", str(port), "--bind", "127.0.0.1"]
        command += ["--dir", str(home), "--logfile", str(home / "redis.log")]
        self.processes[name] = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        wait_for_port(port, self.processes[name], f"redis-server {name}")

    def start(self) -> None:
        """Start the master, its replica (streaming) and the sentinels (each knowing the
        replica and the two others)."""
        # no dump, no log; a full sync starts at once (diskless, without the 5 s wait
        # for more replicas to join it)
        plain = ("--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0")
        self._start("a", self.ports["a"], *plain)
        self._start("b", self.ports["b"], *plain, "--replicaof", "127.0.0.1", str(self.ports["a"]))
        poll(lambda: self.info("b")["master_link_status"] == "up", "b replicating a")
        # Each sentinel is told its own id, the others' and the replica's up front:
        # found by their hello messages instead, they take seven seconds or so.
        ids = [secrets.token_hex(20) for _ in self.sentinel_ports]
        for i, port in enumerate(self.sentinel_ports):
            home = self.directory / f"s{i}"
            home.mkdir(parents=True, exist_ok=True)
            lines = [
                f"sentinel myid {ids[i]}",
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.ports['a']} 2",
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}",
                f"sentinel parallel-syncs {SERVICE} 1",
                f"sentinel known-replica {SERVICE} 127.0.0.1 {self.ports['b']}",
            ]
            lines += [
                f"sentinel known-sentinel {SERVICE} 127.0.0.1 {other} {ids[j]}"
                for j, other in enumerate(self.sentinel_ports)
                if j != i
            ]
            conf = home / "sentinel.conf"  # Sentinel rewrites its file: one of its own
            conf.write_text("\n".join(lines) + "\n")
            self._start(f"s{i}", port, str(conf), "--sentinel")
        for port in self.sentinel_ports:
            poll(lambda port=port: self._knows_all(port), f"sentinel {port} seeing the others")

    def _knows_all(self, port: int) -> bool:
        with self._sentinel(port) as watcher:
            state = watcher.sentinel_master(SERVICE)
        return bool(state["num-slaves"] >= 1 and state["num-other-sentinels"] == 2)

    def _sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2)

    def client(self, name: str) -> redis.Redis:
        """A (blocking) client of node ``name``: use it in a ``with`` block."""
        return redis.Redis(port=self.ports[name], socket_timeout=5, socket_connect_timeout=2)

    def run(self, name: str, *command: str) -> object:
        """One command on node ``name``; its answer."""
        with self.client(name) as node:
            return node.execute_command(*command)

    def get(self, name: str, key: str) -> bytes | None:
        """The raw value of ``key`` on node ``name`` (a replica answers reads too)."""
        with self.client(name) as node:
            found: bytes | None = node.get(key)
        return found

    def info(self, name: str) -> dict[str, object]:
        """Node ``name``'s INFO replication."""
        with self.client(name) as node:
            found: dict[str, object] = node.info("replication")
        return found

    def named(self, port: int) -> str | None:
        """The node sentinel ``port`` names as the master."""
        with self._sentinel(port) as watcher:
            at = watcher.sentinel_get_master_addr_by_name(SERVICE)
        return next((n for n, p in self.ports.items() if at and p == int(at[1])), None)

    def master(self) -> str:
        """The node the first sentinel that answers names as the master."""
        for port in self.sentinel_ports:
            with contextlib.suppress(redis.RedisError):
                found = self.named(port)
                if found is not None:
                    return found
        raise RuntimeError("no sentinel names a master")

    def other(self, name: str) -> str:
        return "b" if name == "a" else "a"

    def kill(self, name: str) -> None:
        """Crash node ``name`` (SIGKILL)."""
        self.processes[name].kill()
        self.processes[name].wait(10)

    def failover(self) -> None:
        """Ask a sentinel for a failover now (``SENTINEL FAILOVER``: no agreement
        needed); return at once."""
        with self._sentinel(self.sentinel_ports[0]) as watcher:
            watcher.sentinel_failover(SERVICE)

    def wait_master(self, name: str) -> float:
        """Wait until every sentinel names node ``name`` as the master and it takes
        writes; when that was (``time.monotonic()``)."""

        def promoted() -> bool:
            names = {self.named(port) for port in self.sentinel_ports}
            return names == {name} and self.info(name)["role"] == "master"

        try:
            poll(promoted, f"the sentinels naming {name} the master")
        except TimeoutError as error:
            raise TimeoutError(f"{error}\n{self.log_tail('s0')}") from None
        return time.monotonic()

    def log_tail(self, name: str, lines: int = 30) -> str:
        """The last lines of a server's log, for an error message."""
        try:
            text = (self.directory / name / "redis.log").read_text(errors="replace")
        except OSError:
            return f"(no log of {name})"
        return f"-- last lines of {name}'s log --\n" + "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Kill every server; safe to call again."""
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)
        atexit.unregister(self.stop)
