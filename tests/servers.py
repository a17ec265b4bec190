"""Test servers started as processes: a free port, a wait for a listener, a redis-server.

Shared by the tests (through :mod:`tests.services`, which adds the pytest rules for a
missing binary) and the benchmarks, which run from a checkout without pytest.
"""

from __future__ import annotations

import asyncio
import atexit
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["PgWire", "RedisServer", "TcpProxy", "free_port", "wait_for_port"]


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

    def __init__(self, directory: Path, port: int | None = None, args: tuple[str, ...] = ()):
        self.port, self.directory = port or free_port(), directory
        self.args = args  # more redis-server options, e.g. ("--requirepass", "secret")
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
                *self.args,
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


class TcpProxy:
    """A loopback TCP proxy in the test's event loop: a link that can be cut.

    ``cut()`` closes every open connection and refuses new ones (a partition, a
    restarted proxy); ``restore()`` lets them through again. ``drop`` is asked with
    each chunk a client sends: when it says so the connection is closed instead of
    forwarding it (a server that dies mid-conversation); ``parser`` makes such a hook
    per connection, for one that keeps state (a protocol parser). ``drop_reply`` is
    asked the same of each chunk the server sends back (an answer lost on its way:
    the server did the work, the client never hears of it).
    """

    def __init__(
        self,
        target_port: int,
        drop: Callable[[bytes], bool] | None = None,
        parser: Callable[[], Callable[[bytes], bool]] | None = None,
        drop_reply: Callable[[bytes], bool] | None = None,
    ) -> None:
        self.target_port = target_port
        self.drop = drop
        self.parser = parser  # makes a ``drop`` per connection (a stateful parser)
        self.drop_reply = drop_reply
        self.port = 0
        self.open = True
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        pair = (writer, up_writer)
        self._writers |= set(pair)
        for task in (
            asyncio.ensure_future(
                self._pipe(reader, up_writer, self.parser() if self.parser else self.drop, pair)
            ),
            asyncio.ensure_future(self._pipe(up_reader, writer, self.drop_reply, pair)),
        ):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        drop: Callable[[bytes], bool] | None,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        try:
            while chunk := await source.read(65536):
                if drop is not None and drop(chunk):
                    break
                sink.write(chunk)
                await sink.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            for writer in pair:  # one side ended: the connection is over
                writer.close()
                self._writers.discard(writer)

    def _close_all(self) -> None:
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    def cut(self) -> None:
        """Close every connection and refuse new ones."""
        self.open = False
        self._close_all()

    def restore(self) -> None:
        """Let connections through again."""
        self.open = True

    async def close(self) -> None:
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


class PgWire:
    """Counts what PostgreSQL clients send, message by message: statements executed
    (Execute, Query) and round trips (each Sync or Query waits for ReadyForQuery).

    ``TcpProxy(port, drop=wire.reader())`` feeds it: one parser per connection.
    """

    def __init__(self) -> None:
        self.executes = self.queries = self.syncs = 0

    def reader(self) -> Callable[[], Callable[[bytes], bool]]:
        """A factory of per-connection parsers, for TcpProxy's ``parser`` argument."""
        return self._connection

    def _connection(self) -> Callable[[bytes], bool]:
        buffer = b""
        started = False

        def feed(chunk: bytes) -> bool:
            nonlocal buffer, started
            buffer += chunk
            while True:
                if not started:  # SSLRequest / StartupMessage: a length, no type byte
                    if len(buffer) < 8:
                        return False
                    length = int.from_bytes(buffer[:4], "big")
                    if len(buffer) < length:
                        return False
                    started = int.from_bytes(buffer[4:8], "big") == 196608  # protocol 3.0
                else:
                    if len(buffer) < 5:
                        return False
                    length = 1 + int.from_bytes(buffer[1:5], "big")
                    if len(buffer) < length:
                        return False
                    kind = buffer[:1]
                    self.executes += kind == b"E"
                    self.queries += kind == b"Q"
                    self.syncs += kind == b"S"
                buffer = buffer[length:]

        return feed

    @property
    def round_trips(self) -> int:
        return self.syncs + self.queries

    @property
    def statements(self) -> int:
        return self.executes + self.queries

    def reset(self) -> None:
        self.executes = self.queries = self.syncs = 0
