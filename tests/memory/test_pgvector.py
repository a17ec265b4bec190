"""pgvector on a PostgreSQL database that has the extension (a database of this test
worker's own, made with it), beside the suite's databases that have not: enabling is
idempotent, searches go through the HNSW index pre-filtered by user and namespace,
and another tenant's nearer vectors never fill a top-k."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from sqlalchemy import func, select, text

from tenxstore import CheckpointRepository, MemoryStore, NewMemory
from tenxstore.backends import pgvector
from tenxstore.backends.pgvector import (
    EXACT_BELOW,
    PgVector,
    aenable,
    astatus,
    doctor_line,
    index_name,
)
from tests import services
from tests.conftest import TEST_KEYS
from tests.memory import test_vectors as portable
from tests.memory.conftest import Clock
from tests.memory.embeddings import HashingEmbedding

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _vector_database() -> str:
    """This worker's database for pgvector (the fixture creates the extension)."""
    base = services.pg_url()
    parts = urlsplit(base)
    name = f"{parts.path.lstrip('/')}_pgvector"
    services._create_pg_database(base, name)
    return parts._replace(path=f"/{name}").geturl()


@pytest.fixture
async def vector_url() -> str:
    import asyncpg

    url = await asyncio.to_thread(_vector_database)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    finally:
        await conn.close()
    return url


@pytest.fixture
async def schema(vector_url: str) -> AsyncIterator[str]:
    import asyncpg

    name = f"v_{uuid.uuid4().hex[:12]}"
    yield name
    conn = await asyncpg.connect(vector_url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


async def _enabled(url: str, schema: str, **options: Any) -> CheckpointRepository:
    repo = CheckpointRepository(url, schema=schema, **options)
    await repo.asetup()
    store = repo.store
    async with store.backend.connect() as conn, conn.begin():
        await aenable(conn, schema)
    return repo


async def test_enable_is_idempotent_and_fills_the_column(vector_url: str, schema: str) -> None:
    repo = CheckpointRepository(vector_url, schema=schema)
    await repo.asetup()
    assert "not enabled" in (await doctor_line(repo.store) or "")
    exact = MemoryStore(repo, embedding=HashingEmbedding())
    await exact.astore("alice", "Alice drinks a double espresso", key="coffee")
    assert exact.vectors is not None and exact.vectors.pg is None  # not enabled yet
    store = repo.store
    for _ in range(2):
        async with store.backend.connect() as conn, conn.begin():
            status, indexes = await aenable(conn, schema)
        assert status.enabled and status.iterative
        assert indexes == [index_name("test-hashing-trigrams", 256)]
    filled = await store.read(
        text(f'SELECT count(*) FROM "{schema}".memory_vectors WHERE embedding IS NOT NULL')
    )
    assert filled[0][0] == 1  # the vector stored before, now in the column too
    line = await doctor_line(repo.store)
    assert line is not None and "enabled (HNSW search)" in line
    found = await MemoryStore(repo, embedding=HashingEmbedding()).asearch("alice", "espressos")
    assert found[0].memory.key == "coffee"
    await repo.aclose()


async def test_without_the_extension_doctor_says_so_and_search_is_exact(tmp_path: Any) -> None:
    from tests.pools import POSTGRESQL

    repo = CheckpointRepository(services.pg_url(), schema=POSTGRESQL.take())
    await repo.asetup()
    async with repo.store.backend.connect() as conn, conn.begin():
        status = await astatus(conn, repo.store.schema)
    assert status.installed is None and not status.enabled  # the suite's databases have none
    line = await doctor_line(repo.store)
    assert line is not None and "available on the server, not created" in line
    store = MemoryStore(repo, embedding=HashingEmbedding())
    await store.astore("alice", "Alice drinks a double espresso", key="coffee")
    assert store.vectors is not None and store.vectors.pg is None
    assert (await store.asearch("alice", "espressos"))[0].memory.key == "coffee"
    await repo.aclose()


def _plan_nodes(plan: Any) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _plan_nodes(child)


async def _search_statement(
    store: MemoryStore, user: str, query: list[float], count: int, *, explain: bool = False
) -> Any:
    """The store's one statement of a search, run by hand (``explain``: its plan as
    it ran, as JSON): its rows."""
    vectors = store.vectors
    assert vectors is not None and vectors.pg is not None
    where = "m.user_id = :v_user AND (m.expires_at IS NULL OR m.expires_at > now())"
    stmt: Any = vectors.pg.search(vectors.model_id, vectors.dims, where, list(store.rows.m.c))
    if explain:
        stmt = text("EXPLAIN (ANALYZE, FORMAT JSON) " + stmt.element.text)
    return await store.base.read(stmt, {"v_user": user, **PgVector.arguments(query, count)})


@pytest.mark.parametrize("small", [0, EXACT_BELOW], ids=["index", "exact"])
async def test_search_is_one_statement_and_never_across_tenants(
    vector_url: str, schema: str, small: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a scope of fewer memories than EXACT_BELOW is searched exactly (made 0: alice's
    # few go through the index, as a large scope's would); every plan that can use an
    # index does: the HNSW index, not a sequential scan
    monkeypatch.setattr(pgvector, "EXACT_BELOW", small)
    no_seqscan = {"connect_args": {"server_settings": {"enable_seqscan": "off"}}}
    repo = await _enabled(vector_url, schema, engine_options=no_seqscan)
    store = MemoryStore(repo, embedding=HashingEmbedding())
    for n in range(120):  # bob's are all nearer to the query than any of alice's
        await store.astore("bob", f"espresso vegetarian espresso {n}", key=f"b{n}")
    for n in range(8):
        await store.astore("alice", f"Alice note {n} about espresso", key=f"a{n}")
    await store.astore("alice", "espresso elsewhere", key="w", namespace=("work",))
    vectors = store.vectors
    assert vectors is not None and vectors.pg is not None and vectors.indexed
    sent: list[str] = []
    remove = repo.store.backend.on_statement(sent.append)
    for mode in ("vector", "hybrid"):
        sent.clear()
        hits = await store.asearch("alice", "espresso vegetarian", limit=5, mode=mode)  # type: ignore[arg-type]
        assert len(hits) == 5 and {h.memory.user_id for h in hits} == {"alice"}, mode
        assert all(h.memory.namespace == ("memories",) for h in hits)
        # one round trip: settings, the scan, the rows (and the keyword ranking) in
        # ONE statement, which no exact search had to follow
        assert len(sent) == 1, (mode, sent)
    remove()
    everything = await store.asearch("alice", "espresso", limit=20, namespace=(), mode="vector")
    assert len(everything) == 9
    query = vectors.embedding.embed_query("espresso vegetarian")
    rows = await _search_statement(store, "alice", query, 5)
    found, right = PgVector.answer(rows, 5)
    assert right and len(found) == 5 and {r.user_id for r, _ in found} == {"alice"}
    # what ran: the HNSW index (iterative: bob's 120 nearer ones never stopped it), or
    # alice's vectors compared exactly
    plan = (await _search_statement(store, "alice", query, 5, explain=True))[0][0]
    nodes = list(_plan_nodes(plan[0]["Plan"]))
    name = index_name("test-hashing-trigrams", 256)
    scanned = [n for n in nodes if n.get("Index Name") == name]
    assert scanned, "the HNSW index is in the plan"
    assert (scanned[0].get("Actual Loops", 0) > 0) == (small == 0)
    # and whatever the tables' statistics (these were never analyzed), a row looked up
    # once per candidate is looked up by its primary key: never by walking the user's
    repeated = [n for n in nodes if n.get("Actual Loops", 0) > 1 and "Relation Name" in n]
    assert repeated and {(n["Relation Name"], n.get("Index Name")) for n in repeated} <= {
        ("memories", "pk_memories"),
        ("memory_vectors", "pk_memory_vectors"),
    }, [(n["Relation Name"], n.get("Index Name")) for n in repeated]
    # without the iterative scan, the same index scan leaves alice with fewer than five
    # (the settings the statement makes are its own: this connection has none)
    async with repo.store.backend.connect() as conn, conn.begin():
        assert (await conn.execute(text("SHOW hnsw.iterative_scan"))).scalar() == "off"
        await conn.execute(text("SET LOCAL hnsw.ef_search = 40"))
        strict = await conn.execute(
            text(
                f'SELECT v.memory_id FROM "{schema}".memory_vectors v '
                f'JOIN "{schema}".memories m ON m.id = v.memory_id '
                "WHERE v.model_id = 'test-hashing-trigrams' AND v.dims = 256 AND "
                "v.embedding IS NOT NULL AND m.user_id = 'alice' ORDER BY "
                "(v.embedding::public.vector(256)) OPERATOR(public.<=>) "
                "CAST(:q AS public.vector(256)) LIMIT 5"
            ),
            {"q": str(query)},
        )
        assert len(strict.all()) < 5  # no iterative scan: bob's vectors filled the scan
    await repo.aclose()


async def test_writes_deletes_and_reembed_keep_the_column(
    vector_url: str, schema: str, clock: Clock
) -> None:
    repo = await _enabled(vector_url, schema)
    store = MemoryStore(repo, embedding=HashingEmbedding())
    await store.astore("alice", "Alice has a golden retriever", key="pet")
    await store.astore("alice", "Alice drinks a double espresso", key="coffee", ttl=60)
    assert (await store.asearch("alice", "retrievers", mode="vector"))[0].memory.key == "pet"
    await store.aupdate("alice", "pet", content="Alice adopted a grey cat")
    assert (await store.asearch("alice", "grey cats", mode="vector"))[0].memory.key == "pet"
    clock.advance(61)
    assert [h.memory.key for h in await store.asearch("alice", "espresso", mode="vector")] == [
        "pet"
    ]  # the expired one is filtered in SQL
    assert await store.adelete("alice", "pet")
    assert await store.asearch("alice", "grey cat", mode="vector") == []
    await store.astore("alice", "Alice is a vegetarian", key="diet")
    small = HashingEmbedding(dims=64, model_id="small")
    assert await store.areembed(small) == 1
    redone = MemoryStore(repo, embedding=small)
    assert (await redone.asearch("alice", "vegetarians", mode="vector"))[0].memory.key == "diet"
    assert redone.vectors is not None and redone.vectors.pg is not None
    vt = store.rows.vt
    old = select(func.count()).select_from(vt).where(vt.c.model_id != "small")
    assert (await repo.store.read(old))[0][0] == 1  # the expired one's, never compared
    await repo.aclose()


async def test_a_bulk_load_fills_the_column_in_its_insert(vector_url: str, schema: str) -> None:
    """``astore_many`` writes the vector column with each row (none left unfilled for
    the index to skip), and its next versions replace it."""
    repo = await _enabled(vector_url, schema)
    store = MemoryStore(repo, embedding=HashingEmbedding())
    facts = ["Alice has a golden retriever", "Alice drinks a double espresso", "Lisbon"]
    await store.astore_many(
        "alice", [NewMemory(t, key=f"k{n}") for n, t in enumerate(facts)] + ["no key"]
    )
    await store.astore_many("alice", [NewMemory("Alice adopted a grey cat", key="k0")])
    unfilled = await repo.store.read(
        text(f'SELECT count(*) FROM "{schema}".memory_vectors WHERE embedding IS NULL')
    )
    assert unfilled[0][0] == 0
    assert (await store.asearch("alice", "grey cats", mode="vector"))[0].memory.key == "k0"
    assert (await store.asearch("alice", "espressos", mode="vector"))[0].memory.key == "k1"
    await repo.aclose()


@pytest.mark.parametrize("small", [0, EXACT_BELOW], ids=["index", "exact"])
async def test_a_scan_that_stops_short_is_answered_exactly(
    vector_url: str, schema: str, small: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # hnsw.max_scan_tuples (20,000 by default) made small: the iterative scan stops
    # among bob's nearer vectors before it reaches alice's, as it would at that size
    # (where alice's few are searched exactly, no scan is made)
    monkeypatch.setattr(pgvector, "EXACT_BELOW", small)
    few = {"connect_args": {"server_settings": {"hnsw.max_scan_tuples": "20"}}}
    repo = await _enabled(vector_url, schema, engine_options=few)
    store = MemoryStore(repo, embedding=HashingEmbedding())
    await store.astore("bob", "espresso vegetarian espresso", key="b")
    async with repo.store.backend.connect() as conn, conn.begin():
        # two thousand copies of bob's, all nearer to the query than any of alice's
        await conn.execute(
            text(
                f'INSERT INTO "{schema}".memories (uid, user_id, namespace, memory_key, '
                "content, metadata, terms, version, created_at, updated_at, expires_at) "
                "SELECT md5(g::text || m.uid), m.user_id, m.namespace, m.memory_key || g, "
                "m.content, m.metadata, m.terms, 1, m.created_at, m.updated_at, NULL "
                f'FROM "{schema}".memories m, generate_series(1, 2000) g'
            )
        )
        await conn.execute(
            text(
                f'INSERT INTO "{schema}".memory_vectors (memory_id, model_id, dims, vector, '
                "embedding) SELECT c.id, v.model_id, v.dims, v.vector, v.embedding "
                f'FROM "{schema}".memories c JOIN "{schema}".memories o ON o.memory_key = '
                f"'b' JOIN \"{schema}\".memory_vectors v ON v.memory_id = o.id "
                "WHERE c.memory_key <> 'b'"
            )
        )
    for n in range(8):
        await store.astore("alice", f"Alice note {n} about espresso", key=f"a{n}")
    vectors = store.vectors
    assert vectors is not None and vectors.pg is not None and vectors.hnsw
    query = vectors.embedding.embed_query("espresso vegetarian")
    found, right = PgVector.answer(await _search_statement(store, "alice", query, 5), 5)
    if small:
        assert right and len(found) == 5  # alice's 8, compared exactly
    else:  # the index alone found none of alice's: exact search must answer
        assert not right and found == []
    for mode in ("vector", "hybrid"):
        hits = await store.asearch("alice", "espresso vegetarian", limit=5, mode=mode)  # type: ignore[arg-type]
        assert len(hits) == 5 and {h.memory.user_id for h in hits} == {"alice"}, mode
    everything = await store.asearch("alice", "espresso", limit=20, mode="vector")
    assert len(everything) == 8
    await repo.aclose()


async def test_rows_written_without_the_column_are_found(vector_url: str, schema: str) -> None:
    repo = CheckpointRepository(vector_url, schema=schema)
    await repo.asetup()
    before = MemoryStore(repo, embedding=HashingEmbedding())  # started before enabling
    await before.astore("alice", "Alice has a golden retriever", key="pet")
    async with repo.store.backend.connect() as conn, conn.begin():
        await aenable(conn, schema)
    await before.astore("alice", "Alice drinks a double espresso", key="coffee")
    assert before.vectors is not None and before.vectors.pg is None
    after = MemoryStore(repo, embedding=HashingEmbedding())
    for mode in ("vector", "hybrid"):
        hits = await after.asearch("alice", "espresso", limit=1, mode=mode)  # type: ignore[arg-type]
        assert [h.memory.key for h in hits] == ["coffee"], mode
    assert after.vectors is not None and after.vectors.pg is not None
    await repo.aclose()


async def test_a_role_that_does_not_own_the_tables(
    vector_url: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    repo = await _enabled(vector_url, schema)
    owner = MemoryStore(repo, embedding=HashingEmbedding())
    await owner.astore("alice", "Alice drinks a double espresso", key="coffee")
    role = f"app_{uuid.uuid4().hex[:12]}"
    grants = [
        f'CREATE ROLE "{role}" LOGIN',
        f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"',
        f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"',
        f'GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA "{schema}" TO "{role}"',
    ]
    async with repo.store.backend.connect() as conn, conn.begin():
        for stmt in grants:
            await conn.execute(text(stmt))
    url = urlsplit(vector_url)
    app_url = url._replace(netloc=f"{role}@{url.hostname}:{url.port or 5432}").geturl()
    try:
        app = MemoryStore(app_url, schema=schema, embedding=HashingEmbedding())
        try:  # the index exists: found in the catalog, never made again
            await app.astore("alice", "Alice has a golden retriever", key="pet")
            assert (await app.asearch("alice", "espresso"))[0].memory.key == "coffee"
            assert app.vectors is not None and app.vectors.hnsw
        finally:
            await app.aclose()
        small = HashingEmbedding(dims=64, model_id="small")
        app = MemoryStore(app_url, schema=schema, embedding=small)
        try:  # a new model's index: this role may not make it, so exact search
            with caplog.at_level("WARNING", logger="tenxstore.memory.vectors"):
                assert await app.areembed() == 2
                hits = await app.asearch("alice", "retrievers", mode="vector")
            assert hits[0].memory.key == "pet"
            assert app.vectors is not None and app.vectors.pg is not None
            assert not app.vectors.hnsw
            assert "could not be made" in caplog.text
        finally:
            await app.aclose()
    finally:
        async with repo.store.backend.connect() as conn, conn.begin():
            await conn.execute(text(f'DROP OWNED BY "{role}"'))
            await conn.execute(text(f'DROP ROLE "{role}"'))
        await repo.aclose()


PORTABLE = [
    portable.test_hybrid_keeps_keyword_only_hits_and_scores_are_in_0_1,
    portable.test_vector_finds_what_keywords_cannot,
    portable.test_filter_namespace_and_limit_apply,
    portable.test_another_users_vectors_never_come_back,
    portable.test_delete_and_store_again,
    portable.test_a_write_without_an_embedding_drops_the_stale_vector,
]


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "encrypted"])
@pytest.mark.parametrize("small", [0, EXACT_BELOW], ids=["index", "exact"])
@pytest.mark.parametrize("case", PORTABLE, ids=[c.__name__.removeprefix("test_") for c in PORTABLE])
async def test_the_portable_searches_on_pgvector(
    vector_url: str,
    schema: str,
    small: int,
    sealed: bool,
    case: Callable[[MemoryStore], Awaitable[None]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # every database's tests of search by meaning (tests/memory/test_vectors.py), here
    # through pgvector's one statement: by the index and exactly, content sealed or not
    monkeypatch.setattr(pgvector, "EXACT_BELOW", small)
    repo = await _enabled(vector_url, schema, keys=TEST_KEYS if sealed else None)
    store = MemoryStore(repo, embedding=HashingEmbedding())
    await case(store)
    assert store.vectors is not None and store.vectors.indexed
    await repo.aclose()


CLOCKED = [
    portable.test_expired_memories_are_never_found,
    portable.test_vectors_are_dropped_with_their_memory_by_a_sweep,
]


@pytest.mark.parametrize("small", [0, EXACT_BELOW], ids=["index", "exact"])
@pytest.mark.parametrize("case", CLOCKED, ids=[c.__name__.removeprefix("test_") for c in CLOCKED])
async def test_expired_memories_are_filtered_in_the_statement(
    vector_url: str,
    schema: str,
    small: int,
    case: Callable[[MemoryStore, Clock], Awaitable[None]],
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pgvector, "EXACT_BELOW", small)
    repo = await _enabled(vector_url, schema)
    await case(MemoryStore(repo, embedding=HashingEmbedding()), clock)
    await repo.aclose()
