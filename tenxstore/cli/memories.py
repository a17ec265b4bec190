"""``tenxstore memories``: list, search, show and sweep long-term memories (operators).

Every command reads every user's memories unless ``--user`` names one; a namespace is
given as its labels joined with ``.`` (``memories.work``), as it is stored.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from ..types import AuthPolicy, Memory
from .common import DEFAULT_URL, App, Schema, Url, command, fail, out, print_table, repository, when

if TYPE_CHECKING:  # the memory store and SQLAlchemy are imported by the command that runs
    from ..repository import CheckpointRepository

__all__ = ["memory_counts", "register"]

# The library's, copied because its module imports SQLAlchemy (--help shows it; checked
# to be the same by tests/unit/test_cli_imports.py).
DEFAULT_SWEEP_BATCH = 500  # tenxstore.memory.lifecycle.DEFAULT_SWEEP_BATCH

app = App(help="Long-term memories: list, search, show, sweep the expired ones.")
UserOption = Annotated[str | None, typer.Option("--user", help="Owner (omit: every user's).")]
NamespaceOption = Annotated[
    str, typer.Option("--namespace", help="Labels joined with '.' ('' : every namespace).")
]
_SHOWN = 60  # characters of content a listing shows


def _labels(namespace: str) -> tuple[str, ...]:
    return tuple(namespace.split(".")) if namespace else ()


def _policy(user: str | None) -> AuthPolicy:
    return AuthPolicy(enforce_user_isolation=user is not None)


def _operator(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., Any]:
    """A command of the operator's, who may name the owner of the shared items
    (``--user '*'``: a shared LangGraph store's, the agents' memories)."""

    @functools.wraps(fn)
    async def run(*args: Any, **kwargs: Any) -> None:
        from ..memory.validation import shared_access

        with shared_access():
            await fn(*args, **kwargs)

    return run


def _short(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _SHOWN else line[: _SHOWN - 1] + "…"


def _table(memories: list[tuple[Memory, float | None]]) -> Table:
    scored = any(score is not None for _, score in memories)
    table = Table(
        "key",
        "owner",
        "namespace",
        "version",
        "updated",
        "expires",
        *(["score"] if scored else []),
        "content",
    )
    for m, score in memories:
        table.add_row(
            m.key,
            str(m.user_id),
            ".".join(m.namespace),
            str(m.version),
            when(m.updated_at),
            when(m.expires_at),
            *([f"{score:.3f}"] if scored else []),
            _short(m.content),
        )
    return table


async def memory_counts(repo: CheckpointRepository) -> tuple[int, int]:
    """(memories, expired ones waiting for a sweep) of a store at head."""
    from sqlalchemy import case, func, select

    store = repo.store
    m = store.tables.memories
    expired = func.coalesce(func.sum(case((m.c.expires_at <= store.now(), 1), else_=0)), 0)
    row: Any = (await store.read(select(func.count(), expired).select_from(m)))[0]
    return int(row[0]), int(row[1])


@app.command("list")
@command
@_operator
async def list_(
    url: Url = DEFAULT_URL,
    schema: Schema = None,
    user: UserOption = None,
    namespace: NamespaceOption = "",
    limit: Annotated[int, typer.Option(help="At most this many.", min=0, max=10_000)] = 50,
) -> None:
    """List memories, most recently written first (expired ones never)."""
    from ..memory.store import MemoryStore

    async with repository(url, schema, reads_only=True) as repo:
        store = MemoryStore(repo)
        found = await store.alist(
            user, namespace=_labels(namespace), limit=limit, auth_policy=_policy(user)
        )
    if not found:
        out.print("no memories" + (f" of user {user!r}" if user else ""))
        return
    print_table(_table([(m, None) for m in found]))


@app.command()
@command
@_operator
async def search(
    query: Annotated[str, typer.Argument(help="Words to look for.")],
    url: Url = DEFAULT_URL,
    schema: Schema = None,
    user: UserOption = None,
    namespace: NamespaceOption = "",
    limit: Annotated[int, typer.Option(help="At most this many.", min=0, max=10_000)] = 5,
    embedding: Annotated[
        str | None,
        typer.Option(help="Search by meaning with this embedding (module:attribute)."),
    ] = None,
    mode: Annotated[
        str | None,
        typer.Option(help="hybrid, vector or keyword (default: hybrid with --embedding)."),
    ] = None,
) -> None:
    """Search memories by keyword (or, with --embedding, by meaning), best first,
    with their scores."""
    from ..memory.store import MemoryStore

    chosen = None if embedding is None else _embedding(embedding, None, None)
    async with repository(url, schema, reads_only=True) as repo:
        store = MemoryStore(repo, embedding=chosen)
        hits = await store.asearch(
            user,
            query,
            namespace=_labels(namespace),
            limit=limit,
            auth_policy=_policy(user),
            mode=mode,  # type: ignore[arg-type]  # checked by asearch
        )
    if not hits:
        out.print("no memory matches")
        return
    print_table(_table([(h.memory, h.score) for h in hits]))


@app.command()
@command
@_operator
async def show(
    key: Annotated[str, typer.Argument(help="The memory's key.")],
    user: Annotated[str, typer.Option("--user", help="Its owner.")],
    url: Url = DEFAULT_URL,
    schema: Schema = None,
    namespace: Annotated[str, typer.Option(help="Its labels joined with '.'.")] = "memories",
) -> None:
    """One memory: its content and metadata, and its retained versions."""
    from ..memory.store import MemoryStore

    async with repository(url, schema, reads_only=True) as repo:
        store = MemoryStore(repo)
        versions = await store.ahistory(user, key, namespace=_labels(namespace))
    if not versions:
        fail(f"no memory {key!r} of user {user!r} in namespace {namespace!r}")
    m = versions[0]
    out.print(
        f"memory {m.key}  owner {m.user_id}  namespace {'.'.join(m.namespace)}  "
        f"version {m.version}  created {when(m.created_at)}  updated {when(m.updated_at)}"
        + (f"  expires {when(m.expires_at)}" if m.expires_at else "")
    )
    out.print(m.content, highlight=False)
    out.print("metadata:")
    out.print_json(data=m.metadata)
    table = Table("version", "written", "content")
    for v in versions:
        table.add_row(str(v.version), when(v.updated_at), _short(v.content))
    print_table(table)


@app.command()
@command
async def sweep(
    url: Url = DEFAULT_URL,
    schema: Schema = None,
    batch_size: Annotated[
        int, typer.Option(help="Memories deleted per transaction (1 to 5000).", min=1, max=5000)
    ] = DEFAULT_SWEEP_BATCH,
) -> None:
    """Delete the expired memories (never returned by any call) with their history,
    in batches; safe to run while the application runs, and on a schedule."""
    from ..memory.store import MemoryStore

    async with repository(url, schema, reads_only=True) as repo:
        done = await MemoryStore(repo).asweep_expired(batch_size=batch_size)
    out.print(f"swept {done} expired memor{'y' if done == 1 else 'ies'}")


def _embedding(spec: str, dims: int | None, model_id: str | None) -> Any:
    """``module:attribute`` imported: a class or factory is called with no argument;
    an embedding, a LangChain ``Embeddings`` or a function of texts is taken as is."""
    import importlib
    import inspect

    from ..embeddings import as_embedding

    module, _, attribute = spec.partition(":")
    if not module or not attribute:
        fail(f"--embedding must be module:attribute (such as mypkg.emb:model), not {spec!r}")
    try:
        found: Any = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        fail(f"cannot import the embedding {spec!r}: {exc}")
    if inspect.isclass(found):
        found = found()
    return as_embedding(found, dims=dims, model_id=model_id)


@app.command()
@command
async def reembed(
    embedding: Annotated[
        str,
        typer.Option(
            help="The embedding as module:attribute (a class is instantiated without "
            "arguments; a function of texts needs --dims)."
        ),
    ] = "tenxstore.embeddings:LocalEmbedding",
    url: Url = DEFAULT_URL,
    schema: Schema = None,
    dims: Annotated[int | None, typer.Option(help="Its vectors' length.")] = None,
    model_id: Annotated[str | None, typer.Option(help="The model id recorded.")] = None,
    batch_size: Annotated[
        int, typer.Option(help="Memories embedded per batch (1 to 5000).", min=1, max=5000)
    ] = 100,
    missing: Annotated[
        bool,
        typer.Option(
            "--missing",
            help="Also embed memories with no vector (after an import or a copy; "
            "memories stored with embed=False get one too).",
        ),
    ] = False,
) -> None:
    """Redo the memories' vectors with an embedding, in resumable batches (each
    written in its own transaction; stopped, it goes on where it stopped when run
    again). Safe to run while the application runs."""
    from ..memory.store import MemoryStore

    chosen = _embedding(embedding, dims, model_id)
    async with repository(url, schema, reads_only=True) as repo:
        done = await MemoryStore(repo).areembed(chosen, batch_size=batch_size, missing=missing)
    out.print(
        f"{done} vector(s) written with {chosen.model_id!r} ({chosen.dims} dims); "
        "every memory with a vector now has one of this model"
    )


@app.command()
@command
async def reindex(
    url: Url = DEFAULT_URL,
    schema: Schema = None,
    qdrant_path: Annotated[
        str | None, typer.Option(help="Qdrant's local mode: its directory.")
    ] = None,
    qdrant_url: Annotated[str | None, typer.Option(help="A Qdrant server.")] = None,
    qdrant_api_key: Annotated[
        str | None,
        typer.Option(help="The server's API key.", envvar="TENXSTORE_QDRANT_API_KEY"),
    ] = None,
    collection: Annotated[
        str, typer.Option(help="The collection of the points.")
    ] = "tenxstore_memories",
    embedding: Annotated[
        str,
        typer.Option(help="The application's embedding as module:attribute (its model and dims)."),
    ] = "tenxstore.embeddings:LocalEmbedding",
    dims: Annotated[int | None, typer.Option(help="Its vectors' length.")] = None,
    model_id: Annotated[str | None, typer.Option(help="Its model id.")] = None,
    batch_size: Annotated[
        int, typer.Option(help="Memories copied per round (1 to 5000).", min=1, max=5000)
    ] = 500,
    recreate: Annotated[
        bool,
        typer.Option(
            "--recreate",
            help="Make the collection anew if it holds another model's vectors or dims.",
        ),
    ] = False,
) -> None:
    """Rebuild the Qdrant collection of the memories' vectors from the database (the
    stored vectors of the embedding's model: nothing is embedded), deleting the
    points of memories gone; safe while the application runs."""
    from ..memory.qdrant import QdrantIndex
    from ..memory.store import MemoryStore

    if (qdrant_path is None) == (qdrant_url is None):
        fail("give --qdrant-path (local mode) or --qdrant-url (a server), one of them")
    chosen = _embedding(embedding, dims, model_id)
    index = QdrantIndex(qdrant_path, url=qdrant_url, api_key=qdrant_api_key, collection=collection)
    repo = repository(url, schema, reads_only=True)
    async with repo, MemoryStore(repo, embedding=chosen, vector_index=index) as store:
        done = await store.areindex(batch_size=batch_size, recreate=recreate)
    out.print(
        f"{done} point(s) written to Qdrant collection {collection!r} "
        f"({chosen.model_id!r}, {chosen.dims} dims)"
    )


@app.command("enable-pgvector")
@command
async def enable_pgvector(url: Url = DEFAULT_URL, schema: Schema = None) -> None:
    """PostgreSQL: create the `vector` extension if it is missing (a superuser's
    right: pgvector is not a trusted extension), add the memories' `vector` column
    filled from the stored vectors, and an HNSW index per embedding model. Idempotent;
    restart the application's processes afterwards (a process that started without
    the column writes without it until then; running this again fills those in)."""
    from ..backends.pgvector import aenable
    from ..memory.store import MemoryStore

    async with repository(url, schema, reads_only=True) as repo:
        store = repo.store
        if not store.backend.vector_extension:
            fail("pgvector is a PostgreSQL extension: this database searches exactly")
        await MemoryStore(repo).alist(None, limit=0, auth_policy=AuthPolicy(False))  # ready
        async with store.backend.connect() as conn, conn.begin():
            status, indexes = await aenable(conn, store.schema)
    out.print(
        f"pgvector {status.installed} enabled (extension in schema "
        f"{status.extension_schema!r}); HNSW indexes: {', '.join(indexes) or 'none yet'}"
    )


async def pgvector_line(repo: CheckpointRepository) -> str | None:
    """What ``doctor`` says of pgvector (None: not PostgreSQL)."""
    from ..backends.pgvector import doctor_line

    return await doctor_line(repo.store)


def register(root: Any) -> None:
    """Add ``memories`` to the ``tenxstore`` app."""
    root.add_typer(app, name="memories")
