"""A PostgreSQL 15 primary and a hot standby on loopback, to crash, promote and rejoin.

Shared by the tests (the pytest rule for missing binaries is theirs: see
:func:`available`). Every PostgreSQL program runs as the ``postgres`` OS user when we
are root (PostgreSQL refuses root), through ``runuser``; SQL goes through ``psql`` so
that the helper blocks the same way inside a running event loop as outside one.

Each node's own settings (port, listen address, socket directory) are given on its
command line, not in its configuration files: ``pg_basebackup`` and ``pg_rewind`` copy
those files from the other node, and a command-line setting outlives the copy.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests import services
from tests.servers import free_port

__all__ = ["PG_BIN", "PgPair", "available", "poll", "started"]

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PROGRAMS = ("initdb", "pg_ctl", "postgres", "pg_basebackup", "pg_rewind", "psql")
WAIT = 30.0  # seconds: every wait for a condition, generous for a loaded 2-core machine
# A Unix socket's path (the directory, then "/.s.PGSQL.<port>") must fit in 107 bytes.
_SOCKET_DIR_MAX = 90

_SETTINGS = """
# tests/replication.py: the same on both nodes (pg_basebackup and pg_rewind copy this
# file); port, listen_addresses and unix_socket_directories are on each node's command line.
wal_level = replica
wal_log_hints = on
max_wal_senders = 10
max_replication_slots = 10
wal_keep_size = '256MB'
hot_standby = on
fsync = on
synchronous_commit = on
max_connections = 100
shared_buffers = '32MB'
wal_retrieve_retry_interval = '200ms'
wal_receiver_status_interval = '1s'
logging_collector = off
log_line_prefix = '%m [%p] %a '
"""

_HBA = """\
local all all trust
local replication all trust
host all all 127.0.0.1/32 trust
host replication all 127.0.0.1/32 trust
"""


def available() -> bool:
    """Whether the PostgreSQL 15 programs this helper runs are all installed."""
    return all(os.access(PG_BIN / program, os.X_OK) for program in PROGRAMS) and (
        os.geteuid() != 0 or shutil.which("runuser") is not None
    )


def poll(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Return once ``condition()`` is true; raise ``TimeoutError`` naming ``what``
    when it is still false after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: still not so after {timeout:.0f} s")
        time.sleep(0.05)  # polling a condition, not waiting for one


@dataclass
class _Node:
    name: str
    port: int
    home: Path  # its socket directory and log; the data directory is inside it

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def log(self) -> Path:
        return self.home / "postgres.log"

    def conninfo(self, application_name: str) -> str:
        """A libpq connection string to this node, as ``application_name``."""
        return f"host=127.0.0.1 port={self.port} user=postgres application_name={application_name}"


class PgPair:
    """Two PostgreSQL 15 nodes, ``"a"`` and ``"b"``: a primary and its hot standby.

    ``start()`` makes ``a`` the primary and ``b`` a streaming standby (synchronous when
    ``synchronous``). ``kill_primary()`` crashes the primary, ``promote()`` makes the
    standby the primary, ``rejoin()`` rewinds the old primary and makes it the new
    primary's standby; ``failover()`` is the first two, timed. ``primary`` and
    ``standby`` name the nodes' current roles (``standby`` is None between a promotion
    and a rejoin). ``stop()`` ends both; it also runs at interpreter exit.

    The data directories go under ``directory`` when the ``postgres`` user can reach
    it; otherwise (a pytest ``tmp_path`` is under a root-only ``/tmp/pytest-of-root``)
    under a fresh directory in ``/tmp`` that ``stop()`` removes, after copying each
    node's log into ``directory``.
    """

    def __init__(self, directory: Path, *, synchronous: bool) -> None:
        self.directory = directory
        self.synchronous = synchronous
        self._user: pwd.struct_passwd | None = pwd.getpwnam("postgres") if _root() else None
        self._scratch: Path | None = None  # the /tmp directory of ours, when one was made
        root = self._place(directory)
        port_a = free_port()
        port_b = free_port()
        while port_b == port_a:
            port_b = free_port()
        self._nodes = {
            "a": _Node("a", port_a, root / "a"),
            "b": _Node("b", port_b, root / "b"),
        }
        self.ports = (port_a, port_b)
        self.primary: str = "a"
        self.standby: str | None = None
        self.writable_at = 0.0  # time.monotonic() when the last promotion took a write
        atexit.register(self.stop)

    # -- places and processes -------------------------------------------------------

    def _place(self, directory: Path) -> Path:
        """The directory the nodes' homes go in: ``directory`` when the server's user
        can reach it and a socket path under it is short enough, else one in /tmp."""
        directory.mkdir(parents=True, exist_ok=True)
        short = len(str(directory / "a")) <= _SOCKET_DIR_MAX
        if self._user is None:
            reachable = True  # the servers run as we do
        else:
            shutil.chown(directory, self._user.pw_uid, self._user.pw_gid)
            probe = ["runuser", "-u", "postgres", "--", "test", "-x", str(directory)]
            reachable = subprocess.run(probe, cwd="/", check=False).returncode == 0
        if reachable and short:
            return directory
        self._scratch = Path(tempfile.mkdtemp(prefix="tenxstore-pgpair-"))
        self._scratch.chmod(0o755)
        self._own(self._scratch)
        (directory / "nodes").write_text(f"{self._scratch}\n")  # where they are, for a look
        return self._scratch

    def _own(self, path: Path) -> None:
        """Give ``path`` to the server's user (when we are root)."""
        if self._user is not None:
            shutil.chown(path, self._user.pw_uid, self._user.pw_gid)

    def _run(self, *command: str, timeout: float = 120) -> str:
        """Run a PostgreSQL program as the server's user; its output, or an error
        with what it said."""
        prefix = ["runuser", "-u", "postgres", "--"] if self._user is not None else []
        done = subprocess.run(
            [*prefix, *command],
            cwd=self._nodes["a"].home.parent,  # one the server's user can enter
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command)} exited with {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        return done.stdout + done.stderr

    def _pg_ctl(self, action: str, name: str, *options: str) -> str:
        return self._run(
            str(PG_BIN / "pg_ctl"), action, "-D", str(self._nodes[name].data), *options
        )

    def _start_node(self, name: str) -> None:
        node = self._nodes[name]
        settings = (
            f"-c port={node.port} -c listen_addresses=127.0.0.1 "
            f"-c unix_socket_directories={shlex.quote(str(node.home))}"
        )
        try:
            self._pg_ctl(
                "start", name, "-w", "-t", str(int(WAIT)), "-l", str(node.log), "-o", settings
            )
        except RuntimeError as error:
            raise RuntimeError(f"{error}\n{self.log_tail(name)}") from None

    def _stop_node(self, name: str, mode: str = "immediate") -> None:
        """Stop a node if it runs; a postmaster that outlives ``pg_ctl stop`` is killed."""
        node = self._nodes[name]
        pid_file = node.data / "postmaster.pid"
        if not pid_file.exists():
            return
        try:
            self._pg_ctl("stop", name, "-m", mode, "-w", "-t", str(int(WAIT)))
        except (RuntimeError, subprocess.TimeoutExpired):
            with contextlib.suppress(OSError, ValueError, IndexError):
                pid = int(pid_file.read_text().split()[0])
                if b"postgres" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)  # it outlived pg_ctl stop: end it

    def log_tail(self, name: str, lines: int = 30) -> str:
        """The last lines of a node's server log, for an error message."""
        try:
            text = self._nodes[name].log.read_text(errors="replace").splitlines()
        except OSError:
            return f"(no log of node {name})"
        return f"-- last lines of node {name}'s log --\n" + "\n".join(text[-lines:])

    # -- SQL ------------------------------------------------------------------------

    def sql(self, name: str, *statements: str, database: str = "test") -> str:
        """Run ``statements`` on node ``name`` with psql, each in a transaction of its
        own; what they print (unaligned, tuples only), or ``RuntimeError``."""
        command = [str(PG_BIN / "psql"), "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"]
        command += ["-h", "127.0.0.1", "-p", str(self._nodes[name].port), "-U", "postgres"]
        command += ["-d", database]
        for statement in statements:
            command += ["-c", statement]
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=WAIT,
            check=False,
            env={**os.environ, "PGCONNECT_TIMEOUT": "5"},
        )
        if done.returncode != 0:
            raise RuntimeError(f"psql on node {name} exited with {done.returncode}: {done.stderr}")
        return done.stdout.strip()

    def _sql_or_none(self, name: str, statement: str) -> str | None:
        try:
            return self.sql(name, statement)
        except (RuntimeError, subprocess.TimeoutExpired):
            return None

    def wait_sql(self, name: str, statement: str, expected: str, what: str) -> None:
        """Poll ``statement`` on ``name`` until it prints ``expected``."""
        try:
            poll(lambda: self._sql_or_none(name, statement) == expected, what)
        except TimeoutError as error:
            seen = self._sql_or_none(name, statement)
            raise TimeoutError(f"{error} (last answer: {seen!r})\n{self.log_tail(name)}") from None

    def _set_sync_standby(self, standby: str | None) -> None:
        """Name the synchronous standby on the primary (None: none), reload, and wait
        until a new session sees the setting."""
        primary = self.primary
        if standby is None:
            self.sql(primary, "ALTER SYSTEM RESET synchronous_standby_names")
        else:
            self.sql(
                primary,
                f"ALTER SYSTEM SET synchronous_standby_names = '{standby}'",
                "ALTER SYSTEM SET synchronous_commit = on",
            )
        self.sql(primary, "SELECT pg_reload_conf()")
        self.wait_sql(
            primary,
            "SHOW synchronous_standby_names",
            standby or "",
            f"node {primary} reloading synchronous_standby_names",
        )

    def _wait_streaming(self, standby: str) -> None:
        """Wait until the primary streams to ``standby`` (synchronously when the pair is
        synchronous) on the primary's own timeline.

        The primary's pg_stat_replication alone can say ``streaming`` of a standby that
        cannot follow it: one whose WAL went past the point where the primary's timeline
        forked off streams the old timeline to its end, fails, and reconnects, again
        and again. Its WAL receiver's timeline tells the two apart.
        """
        expected = "streaming|sync" if self.synchronous else "streaming|async"
        seen: dict[str, str | None] = {}

        def streaming() -> bool:
            seen["primary"] = self._sql_or_none(
                self.primary,
                "SELECT state || '|' || sync_state || '|' || ('x' || substr("
                "pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int "
                f"FROM pg_stat_replication WHERE application_name = '{standby}'",
            )
            seen["standby"] = self._sql_or_none(
                standby,
                "SELECT status || '|' || received_tli FROM pg_stat_wal_receiver",
            )
            if seen["primary"] is None or not seen["primary"].startswith(expected + "|"):
                return False
            timeline = seen["primary"].rsplit("|", 1)[1]
            return seen["standby"] == f"streaming|{timeline}"

        try:
            poll(streaming, f"node {self.primary} streaming to {standby} ({expected})")
        except TimeoutError as error:
            raise TimeoutError(
                f"{error}: primary (state|sync_state|timeline) {seen.get('primary')!r}, "
                f"standby (status|timeline) {seen.get('standby')!r}\n{self.log_tail(standby)}"
            ) from None

    # -- the pair -------------------------------------------------------------------

    def url(self, name: str) -> str:
        """A libpq URL of node ``name``'s database ``test``."""
        return f"postgresql://postgres@127.0.0.1:{self._nodes[name].port}/test"

    def multi_host_url(self) -> str:
        """A URL of both nodes that connects to whichever accepts writes."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"postgresql://postgres@{hosts}/test?target_session_attrs=read-write"

    def start(self) -> None:
        """Make ``a`` a primary with a database ``test`` and ``b`` its streaming standby
        (synchronous when the pair is), and wait until ``b`` streams."""
        a, b = self._nodes["a"], self._nodes["b"]
        for node in (a, b):
            node.home.mkdir(mode=0o755)
            self._own(node.home)
        self._run(
            str(PG_BIN / "initdb"),
            "-D",
            str(a.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",  # the server itself runs with fsync on; initdb's own flush is moot here
        )
        with (a.data / "postgresql.conf").open("a") as conf:
            conf.write(_SETTINGS)
        (a.data / "pg_hba.conf").write_text(_HBA)
        self._start_node("a")
        self.sql("a", "CREATE DATABASE test", database="postgres")
        self._run(
            str(PG_BIN / "pg_basebackup"),
            "-D",
            str(b.data),
            "-d",
            a.conninfo("b"),
            "-X",
            "stream",
            "-c",
            "fast",
            "-R",  # standby.signal, and primary_conninfo with application_name=b
            "--no-sync",
        )
        # node b's port, taken again now: the one picked seconds ago (before initdb and
        # the base backup) may have gone to another process meanwhile
        b.port = free_port()
        while b.port == a.port:
            b.port = free_port()
        self.ports = (a.port, b.port)
        self._start_node("b")
        self.standby = "b"
        if self.synchronous:
            self._set_sync_standby("b")
        self._wait_streaming("b")

    def kill_primary(self) -> None:
        """Crash the primary: ``pg_ctl stop -m immediate`` (no shutdown checkpoint,
        nothing written beyond what was already durable)."""
        self._pg_ctl("stop", self.primary, "-m", "immediate", "-w", "-t", str(int(WAIT)))

    def promote(self) -> None:
        """Promote the standby; return once it commits a write. Its
        synchronous_standby_names is cleared (there is no standby to wait for), and it
        becomes ``primary`` with ``standby`` None until :meth:`rejoin`."""
        name = self.standby
        if name is None:
            raise RuntimeError("no standby to promote")
        self._pg_ctl("promote", name, "-w", "-t", str(int(WAIT)))
        self.wait_sql(name, "SELECT pg_is_in_recovery()", "f", f"node {name} leaving recovery")
        self.primary, self.standby = name, None
        self._set_sync_standby(None)  # before a commit: none may wait for a gone standby
        self.sql(name, "SELECT txid_current()")  # a transaction id: it accepts writes
        self.writable_at = time.monotonic()

    def failover(self) -> float:
        """Crash the primary and promote the standby: the seconds from the crash to the
        new primary accepting writes."""
        started = time.monotonic()
        self.kill_primary()
        self.promote()
        return self.writable_at - started

    def rejoin(self) -> None:
        """Make the stopped old primary a standby of the new one: rewound with pg_rewind
        from the new primary, started with standby.signal and a primary_conninfo of its
        own application_name, streaming (synchronously when the pair is)."""
        if self.standby is not None:
            raise RuntimeError(f"node {self.standby} is already the standby")
        old = "b" if self.primary == "a" else "a"
        node, source = self._nodes[old], self._nodes[self.primary]
        self._stop_node(old)  # killed already, unless the caller only promoted
        # pg_rewind reads the source's timeline from its control file, which a promotion
        # updates only at its next checkpoint: without one it finds both on the old
        # timeline, says no rewind is required, and the old primary cannot follow.
        self.sql(self.primary, "CHECKPOINT")
        # The target was crashed: pg_rewind 15 first runs it in single-user mode for
        # crash recovery (ending with a clean shutdown), then rewinds it.
        self._run(
            str(PG_BIN / "pg_rewind"),
            "--target-pgdata",
            str(node.data),
            "--source-server",
            source.conninfo(f"pg_rewind_{old}"),
            "--no-sync",
        )
        self._follow(old, self.primary)
        self._start_node(old)
        self.standby = old
        if self.synchronous:
            self._set_sync_standby(old)
        self._wait_streaming(old)

    def _follow(self, name: str, primary: str) -> None:
        """Write standby.signal, and primary_conninfo to ``primary`` as application
        ``name`` into postgresql.auto.conf (replacing the one pg_rewind copied over)."""
        node = self._nodes[name]
        conninfo = self._nodes[primary].conninfo(name)
        auto = node.data / "postgresql.auto.conf"
        lines = [
            line
            for line in auto.read_text().splitlines()
            if line.split("=", 1)[0].strip() not in ("primary_conninfo", "primary_slot_name")
        ]
        lines.append(f"primary_conninfo = '{conninfo}'")
        auto.write_text("\n".join(lines) + "\n")
        signal_file = node.data / "standby.signal"
        signal_file.touch()
        for path in (auto, signal_file):
            self._own(path)

    def pause(self, name: str) -> list[int]:
        """Stop (SIGSTOP) every process of node ``name``, as a hung machine would be;
        the pids, for :meth:`resume`."""
        pid = int((self._nodes[name].data / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(
            ["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False
        ).stdout.split()
        pids = [pid, *(int(child) for child in children)]
        for each in pids:
            os.kill(each, signal.SIGSTOP)
        return pids

    @staticmethod
    def resume(pids: list[int]) -> None:
        """Let the processes :meth:`pause` stopped go on."""
        for each in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGCONT)

    def stop(self) -> None:
        """Stop both nodes at once (immediate); safe to call again. A directory of ours
        in /tmp is removed, each node's log copied into ``directory`` first."""
        for name in self._nodes:
            self._stop_node(name)
        if self._scratch is not None and self._scratch.exists():
            for name, node in self._nodes.items():
                with contextlib.suppress(OSError):
                    shutil.copyfile(node.log, self.directory / f"{name}.log")
            shutil.rmtree(self._scratch, ignore_errors=True)
        self.standby = None
        atexit.unregister(self.stop)


@contextlib.contextmanager
def started(directory: Path, *, synchronous: bool) -> Iterator[PgPair]:
    """A primary and a streaming standby, stopped afterwards (the programs missing:
    skipped, or failed under CI)."""
    if not available():
        services.require_path("PostgreSQL 15's server programs", PG_BIN / "pg_rewind")
    nodes = PgPair(directory, synchronous=synchronous)
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.stop()


def _root() -> bool:
    return os.geteuid() == 0
