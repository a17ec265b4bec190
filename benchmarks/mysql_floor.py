"""MariaDB/MySQL's floor for ``benchmarks/floors.py``: the fewest round trips the work
needs on raw asyncmy, prepared (the binary protocol), on a held connection.

* the write: ONE prepared ``CALL`` of a procedure of the floor's own — the
  compare-and-swap of the version and owner under the row lock, the state, the new
  messages (a JSON array through ``JSON_TABLE``), the prune and COMMIT — as MySQL has
  neither a data-modifying CTE nor ``RETURNING`` (five round trips as separate
  statements, or one multi-statement text query, cost more: see ``--compare`` below);
* the read: ONE prepared ``SELECT`` of the head state, plus ``orjson.loads``;
* the connection runs in autocommit (the procedure commits its own transaction; a read
  needs no COMMIT) and READ COMMITTED, as tenxstore's do (REPEATABLE READ's next-key
  locks on the prune make writers of different threads deadlock).

    python benchmarks/mysql_floor.py --compare   # the three write forms side by side
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
import uuid
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

import orjson
from workload import MYSQL_URL, next_state, timed_runs, turn_messages

from tenxstore import CheckpointRepository

USER = "u"
READ_COMMITTED = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"

#: The floor's write: what tenx_commit_head does, for one owner and no incarnation.
FLOOR_PROCEDURE = """
CREATE PROCEDURE floor_commit_head(
    IN p_thread VARCHAR(255) COLLATE {collation}, IN p_user VARCHAR(255) COLLATE {collation},
    IN p_expected BIGINT,
    IN p_state LONGTEXT, IN p_now DATETIME(6), IN p_messages LONGTEXT, IN p_limit BIGINT)
MODIFIES SQL DATA
BEGIN
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    UPDATE threads SET version = version + 1, updated_at = p_now
        WHERE thread_id = p_thread AND user_id = p_user AND version = p_expected;
    IF ROW_COUNT() = 1 THEN
        INSERT INTO states (thread_id, version, state_data, created_at)
            VALUES (p_thread, p_expected + 1, p_state, p_now);
        INSERT INTO messages (thread_id, message_id, role, payload, created_at)
            SELECT p_thread, b.message_id, b.role, b.payload, p_now
            FROM JSON_TABLE(p_messages, '$[*]' COLUMNS (
                ord FOR ORDINALITY, message_id LONGTEXT PATH '$[0]',
                role LONGTEXT PATH '$[1]', payload LONGTEXT PATH '$[2]')) AS b
            ORDER BY b.ord
            ON DUPLICATE KEY UPDATE thread_id = messages.thread_id;
        DELETE pruned FROM states AS pruned FORCE INDEX (uq_states_thread_id_version)
            WHERE pruned.thread_id = p_thread AND pruned.version <= p_expected + 1 - p_limit;
        COMMIT;
        SELECT p_expected + 1;
    ELSE
        ROLLBACK;
        SELECT NULL FROM DUAL WHERE FALSE;
    END IF;
END
"""
_READ = (
    "SELECT s.state_data FROM threads t JOIN states s ON s.thread_id = t.thread_id"
    " AND s.version = t.version WHERE t.thread_id = ? AND t.user_id = ?"
)
_CALL = "CALL floor_commit_head(?, ?, ?, ?, ?, ?, ?)"


def mysql_args(url: str, database: str | None = None) -> dict[str, Any]:
    """asyncmy's connect arguments for a mysql:// URL (and another database)."""
    parts = urlsplit(url.replace("mysql+asyncmy://", "mysql://"))
    args: dict[str, Any] = {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": parts.username or "root",
        "password": parts.password or "",
    }
    if database is not None:
        args["db"] = database
    return args


async def mysql_database(database: str, *, drop: bool = False) -> None:
    """Create (or drop) a database beside the URL's."""
    import asyncmy  # type: ignore[import-untyped]

    con = await asyncmy.connect(**mysql_args(MYSQL_URL), autocommit=True)
    try:
        async with con.cursor() as cursor:
            verb = "DROP DATABASE IF EXISTS" if drop else "CREATE DATABASE"
            await cursor.execute(f"{verb} `{database}`")
    finally:
        con.close()


def message_json(messages: list[dict[str, Any]]) -> str:
    """The write's messages as the procedure takes them: ``[[id, role, payload], ...]``."""
    return orjson.dumps([[m["id"], m["role"], orjson.dumps(m).decode()] for m in messages]).decode()


class MysqlFloor:
    """The floor's thread on one held asyncmy connection (see the module)."""

    def __init__(self, database: str, thread: str, history: int) -> None:
        self.database, self.thread, self.history = database, thread, history
        self.version = 0

    async def prepare(self, con: Any = None) -> MysqlFloor:
        """Connect (unless given a connection), make the procedure (once per database)
        and the thread, and prepare both statements."""
        import asyncmy

        self.con = con or await asyncmy.connect(
            **mysql_args(MYSQL_URL, self.database), autocommit=True, init_command=READ_COMMITTED
        )
        async with self.con.cursor() as c:
            await c.execute(
                "SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = "
                "DATABASE() AND ROUTINE_NAME = 'floor_commit_head'"
            )
            if not (await c.fetchone())[0]:
                # the ids' own collation: compared under another, the prune could not
                # use the (thread_id, version) key and would lock other threads' rows
                await c.execute(
                    "SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA ="
                    " DATABASE() AND TABLE_NAME = 'threads' AND COLUMN_NAME = 'thread_id'"
                )
                collation = (await c.fetchone())[0]
                await c.execute(FLOOR_PROCEDURE.format(collation=collation))
            await c.execute(
                "INSERT INTO threads (thread_id, user_id, version, created_at, updated_at)"
                " VALUES (%s, %s, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
                (self.thread, USER),
            )
        self.call = await self.con.prepare(_CALL)
        self.select = await self.con.prepare(_READ)
        return self

    async def write(self, state: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        now = datetime.now(timezone.utc).replace(tzinfo=None)
        result = await self.call.execute(
            (
                self.thread,
                USER,
                self.version,
                orjson.dumps(state).decode(),
                now,
                message_json(messages),
                self.history,
            )
        )
        assert result.rows, "the floor's compare-and-swap failed"
        self.version = result.rows[0][0]

    async def read(self) -> Any:
        result = await self.select.execute((self.thread, USER))
        return orjson.loads(result.rows[0][0])


async def mysql_throughput(
    conversations: int, turns: int, seed: int, history: int
) -> dict[str, dict[str, float]]:
    """``conversations`` concurrent conversations (read + write each turn): the floor on
    asyncmy's pool of 10 autocommit connections (statements prepared once on each),
    then tenxstore on its own pool of 10, in a shuffled order."""
    import asyncmy

    database = f"floors_tp_{uuid.uuid4().hex[:8]}"
    await mysql_database(database)
    base = MYSQL_URL.rsplit("/", 1)[0]
    tenx = CheckpointRepository(
        f"{base}/{database}",
        state_history_limit=history,
        engine_options={"pool_size": 10, "max_overflow": 0},
    )
    await tenx.asetup()
    pool = await asyncmy.create_pool(
        minsize=10,
        maxsize=10,
        autocommit=True,
        init_command=READ_COMMITTED,
        **mysql_args(MYSQL_URL, database),
    )
    rng = random.Random(seed)
    data, context = [], []
    for turn in range(turns):
        messages = turn_messages(turn, rng)
        context = [*context, *messages]
        data.append((next_state(turn, context, rng), messages))
    floors: dict[Any, dict[int, MysqlFloor]] = {}  # per pooled connection: its statements

    async def floor_op(c: int, state: Any = None, messages: Any = None) -> None:
        async with pool.acquire() as con:
            held = floors.setdefault(con, {})
            floor = held.get(c)
            if floor is None:
                floor = held[c] = MysqlFloor(database, f"floor-{c}", history)
                floor.con, floor.version = con, versions[c]
                floor.call = await con.prepare(_CALL)
                floor.select = await con.prepare(_READ)
            if state is None:
                await floor.read()
            else:
                floor.version = versions[c]  # another connection may have written it since
                await floor.write(state, messages)
                versions[c] = floor.version

    versions = [0] * conversations
    configs = [{"thread_id": f"tenx-{c}", "user_id": USER} for c in range(conversations)]

    async def floor_conversation(c: int) -> None:
        for state, messages in data[1:]:
            await floor_op(c)
            await floor_op(c, state, messages)

    async def tenx_conversation(c: int) -> None:
        for state, messages in data[1:]:
            await tenx.aget_state(configs[c])
            await tenx.aput_checkpoint(configs[c], state, messages)

    try:
        async with pool.acquire() as con:  # the procedure and the threads, untimed
            for c in range(conversations):
                first = await MysqlFloor(database, f"floor-{c}", history).prepare(con)
                await first.write(*data[0])
                versions[c] = first.version
        await asyncio.gather(
            *(tenx.aput_checkpoint(configs[c], *data[0]) for c in range(conversations))
        )
        results = await timed_runs(
            [("floor-mysql", floor_conversation), ("tenx-mysql", tenx_conversation)],
            conversations,
            turns,
            seed,
        )
    finally:
        pool.close()
        await pool.wait_closed()
        await tenx.aclose()
        await mysql_database(database, drop=True)
    return results


async def compare(turns: int) -> None:
    """The write as five statements, as one multi-statement text query and as one
    prepared CALL, side by side on one connection each (shuffled every turn)."""
    import asyncmy

    database = f"floors_cmp_{uuid.uuid4().hex[:8]}"
    await mysql_database(database)
    base = MYSQL_URL.rsplit("/", 1)[0]
    tenx = CheckpointRepository(f"{base}/{database}", state_history_limit=20)
    await tenx.asetup()  # the tables
    await tenx.aclose()
    call = await MysqlFloor(database, "call", 20).prepare()
    texts = {}
    for name in ("five", "multi"):
        con = await asyncmy.connect(
            **mysql_args(MYSQL_URL, database), autocommit=False, init_command=READ_COMMITTED
        )
        floor = MysqlFloor(database, name, 20)
        await floor.prepare(con)
        texts[name] = floor
    rng = random.Random(1)
    context: list[dict[str, Any]] = []
    wall: dict[str, list[float]] = {"five": [], "multi": [], "call": []}
    cpu: dict[str, list[float]] = {k: [] for k in wall}
    try:
        for turn in range(turns):
            messages = turn_messages(turn, rng)
            context = [*context, *messages]
            state = next_state(turn, context, rng)
            forms = [
                ("five", _five(texts["five"])),
                ("multi", _multi(texts["multi"])),
                ("call", call.write),
            ]
            random.shuffle(forms)
            for name, write in forms:
                c0, w0 = time.process_time(), time.perf_counter()
                await write(state, messages)
                wall[name].append(time.perf_counter() - w0)
                cpu[name].append(time.process_time() - c0)
        for name in wall:
            print(
                f"{name:6} p50 {statistics.median(wall[name]) * 1e6:7.0f} µs wall,"
                f" {statistics.median(cpu[name]) * 1e6:6.0f} µs CPU"
            )
    finally:
        call.con.close()
        for floor in texts.values():
            floor.con.close()
        await mysql_database(database, drop=True)


def _statements(floor: MysqlFloor, state: Any, messages: Any) -> list[tuple[str, list[Any]]]:
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    version = floor.version + 1
    rows = ", ".join(["(%s, %s, %s, %s, %s)"] * len(messages))
    values: list[Any] = []
    for m in messages:
        values += [floor.thread, m["id"], m["role"], orjson.dumps(m).decode(), now]
    return [
        (
            "UPDATE threads SET version = version + 1, updated_at = %s"
            " WHERE thread_id = %s AND user_id = %s AND version = %s",
            [now, floor.thread, USER, floor.version],
        ),
        (
            "INSERT INTO states (thread_id, version, state_data, created_at)"
            " VALUES (%s, %s, %s, %s)",
            [floor.thread, version, orjson.dumps(state).decode(), now],
        ),
        (
            "INSERT INTO messages (thread_id, message_id, role, payload, created_at)"
            f" VALUES {rows} ON DUPLICATE KEY UPDATE thread_id = thread_id",
            values,
        ),
        (
            "DELETE FROM states WHERE thread_id = %s AND version <= %s",
            [floor.thread, version - floor.history],
        ),
    ]


def _five(floor: MysqlFloor) -> Any:
    async def write(state: Any, messages: Any) -> None:
        async with floor.con.cursor() as c:
            for sql, values in _statements(floor, state, messages):
                await c.execute(sql, values)
        await floor.con.commit()
        floor.version += 1

    return write


def _multi(floor: MysqlFloor) -> Any:
    async def write(state: Any, messages: Any) -> None:
        statements = _statements(floor, state, messages)
        async with floor.con.cursor() as c:
            sql = ";".join(s for s, _ in statements) + ";COMMIT"
            await c.execute(sql, [v for _, values in statements for v in values])
            while await c.nextset():
                pass
        floor.version += 1

    return write


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--compare", action="store_true")
    parser.add_argument("--turns", type=int, default=300)
    cli = parser.parse_args()
    if cli.compare:
        asyncio.run(compare(cli.turns))
