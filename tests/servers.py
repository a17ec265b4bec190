"""Test servers started as processes: a free port, a wait for a listener, a redis-server.

Shared by the tests (through :mod:`tests.services`, which adds the pytest rules for a
missing binary) and the benchmarks, which run from a checkout without pytest.
"""

from __future__ import annotations

import atexit
import shutil
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["RedisServer", "free_port", "wait_for_port"]


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    """Return once ``process`` listens on ``port``; raise if it exits or takes 15 s."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.02)  # waiting for a server to listen
    raise RuntimeError(f"{what} did not listen on {port}")


class RedisServer:
    """A redis-server of our own on a spare loopback port, to kill and restart."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.port, self.directory = port or free_port(), directory
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it (again, on the same port) and wait until it listens."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server is not installed")
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
            ],
            stdout=subprocess.DEVNULL,
        )
        atexit.register(self.process.kill)
        wait_for_port(self.port, self.process, "redis-server")

    def kill(self) -> None:
        """Kill it at once, as a crash would."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
