"""Migration 0010 makes each database's keyword index; a downgrade takes it away, and
the search statements use it (PostgreSQL's planner picks the GIN index)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from tenxstore import MemoryStore, migrate
from tests.conftest import SQL_BACKENDS, backend_for

_INDEX = {
    "sqlite": "SELECT count(*) FROM sqlite_master WHERE name LIKE 'memories_fts%'",
    "postgresql": "SELECT count(*) FROM pg_indexes WHERE indexname = 'ix_memories_terms' "
    "AND schemaname = :schema",
    "pgbouncer": "SELECT count(*) FROM pg_indexes WHERE indexname = 'ix_memories_terms' "
    "AND schemaname = :schema",
    "mariadb": "SELECT count(*) FROM information_schema.statistics WHERE table_schema = "
    "DATABASE() AND index_name = 'ix_memories_terms' AND index_type = 'FULLTEXT'",
}
# the FTS5 table, its five shadow tables and three triggers
_EXPECTED = {"sqlite": 9, "postgresql": 1, "pgbouncer": 1, "mariadb": 1}


async def _count(store: MemoryStore, name: str, schema: str | None) -> int:
    async with store.repository.engine.connect() as conn:
        return int((await conn.execute(text(_INDEX[name]), {"schema": schema})).scalar_one())


@pytest.mark.parametrize("name", SQL_BACKENDS)
async def test_the_keyword_index_comes_and_goes_with_0010(name: str, tmp_path: Path) -> None:
    async with backend_for(name, tmp_path, fresh=True) as backend:
        store = MemoryStore(await backend.make())
        assert await _count(store, name, backend.schema) == _EXPECTED[name]
        await migrate.downgrade(
            store.repository.backend, schema=backend.schema, revision="0009_store_sealed"
        )
        assert await _count(store, name, backend.schema) == 0
        await migrate.upgrade(store.repository.backend, schema=backend.schema)
        assert await _count(store, name, backend.schema) == _EXPECTED[name]


async def test_postgresql_search_uses_the_gin_index(tmp_path: Path) -> None:
    async with backend_for("postgresql", tmp_path) as backend:
        store = MemoryStore(await backend.make())
        rows = [
            {"uid": f"{n:032x}", "user_id": f"u{n % 50}", "namespace": "memories",
             "memory_key": f"k{n}", "content": '"x"', "metadata": "{}",
             "terms": f"word{n} common", "version": 1}
            for n in range(3000)
        ]  # fmt: skip
        now = store.base.now()
        m = store.rows.m
        async with store.repository.engine.begin() as conn:
            await conn.execute(
                m.insert(), [{**r, "created_at": now, "updated_at": now} for r in rows]
            )
            await conn.execute(text(f'ANALYZE "{backend.schema}".memories'))
        from tenxstore.memory import search

        stmt = search.ranked(
            store.base.backend.keywords, m, ["word7"], store.rows.scope(None, None, now)
        )
        compiled = stmt.compile(
            store.repository.engine.sync_engine, compile_kwargs={"literal_binds": True}
        )
        async with store.repository.engine.connect() as conn:
            plan = "\n".join(r[0] for r in await conn.execute(text(f"EXPLAIN {compiled}")))
        assert "ix_memories_terms" in plan, plan
