"""QdrantIndex: Qdrant as the vector index of a :class:`~tenxstore.MemoryStore`
(``tenxstore[qdrant]``).

The database stays the source of truth (records, versions, history, TTL, isolation,
and every vector in ``memory_vectors``); Qdrant holds a copy of the vectors of one
embedding model, in two collections:

- ``collection``: a point per memory, its id a UUID of (user, namespace, key) — a
  memory written again overwrites its point, and one deleted and stored again takes
  the same one — with the payload ``user``, ``namespace``, ``ns_path`` (the
  namespace and every prefix of it: a namespace search is one match), ``key``,
  ``memory_id``, ``expires_at`` (seconds since the epoch, or null) and ``rev`` (the
  row's ``uid``, version and vector model: what a search compares with the row it
  reads).
- ``collection + "_revisions"``: a marker per (user, namespace) holding the database
  revision (``memory_revisions``) the scope's points were last brought to, and one
  point of the collection's model, dims and database (``store_id``).

This module only speaks to Qdrant: every error of the client is an
:class:`IndexUnavailable` here, which the store's glue (:mod:`.indexing`) answers by
searching the database's own index. The client is ``qdrant_client``'s
``AsyncQdrantClient``, imported when first needed.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import ConfigError, TenxStoreError
from ..extras import require_extra

if TYPE_CHECKING:
    from qdrant_client import AsyncQdrantClient

__all__ = ["IndexUnavailable", "Point", "QdrantIndex", "point_id", "rev_of"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_IDS = uuid.UUID("5b1c7e0a-3f4d-4c59-9a57-7d0e0f2a1c11")  # the namespace of point ids
_META = str(uuid.uuid5(_IDS, "meta"))
SCROLL = 1000
"""Points a scroll of Qdrant reads a page."""


class IndexUnavailable(TenxStoreError, ConnectionError):
    """Qdrant failed a call (down, timed out, a collection gone). A search is then
    answered by the database's own index and a write's copy is repaired later; only
    :meth:`~tenxstore.MemoryStore.areindex` raises it."""


def point_id(user: Any, namespace: str, key: str) -> str:
    """The point of a memory: a UUID of its user, namespace and key (as one JSON
    array: no two of them make the same text, whatever characters they hold)."""
    return str(uuid.uuid5(_IDS, json.dumps(["m", str(user), namespace, key])))


def marker_id(user: Any, namespace: str) -> str:
    """The marker of a (user, namespace)."""
    return str(uuid.uuid5(_IDS, json.dumps(["s", str(user), namespace])))


def rev_of(uid: str, version: int, model_id: str, written: int) -> str:
    """What a point's ``rev`` must be for the row it copies: its life, version, vector
    model and the vector's write (``memory_vectors.written``: a vector written again at
    the same version, as ``areembed`` does, is another ``rev``)."""
    return f"{uid}:{version}:{model_id}:{written}"


def ns_path(namespace: str) -> list[str]:
    """The namespace and each prefix of it (``a.b.c``: ``a``, ``a.b``, ``a.b.c``)."""
    labels = namespace.split(".")
    return [".".join(labels[: n + 1]) for n in range(len(labels))]


@dataclass(frozen=True)
class Point:
    """One memory's point, as the database has it."""

    user: str
    namespace: str
    key: str
    memory_id: int
    rev: str
    expires_at: float | None
    vector: list[float]


def _client_module() -> Any:
    """qdrant_client, or a MissingExtra saying how to install it."""
    require_extra("qdrant", "qdrant_client", needed_by="QdrantIndex")
    import qdrant_client

    return qdrant_client


class QdrantIndex:
    """Qdrant as the vector index of a :class:`~tenxstore.MemoryStore`
    (``MemoryStore(url, embedding=..., vector_index=QdrantIndex(...))``).

    Exactly one of ``path``, ``url`` and ``client``.

    Args:
        path: A directory for Qdrant's local mode (in this process, no server; one
            process at a time may open it).
        url: A Qdrant server (``http://host:6333``; Qdrant Cloud's URL).
        api_key: The server's API key (with ``url``).
        collection: The collection of the points; its markers are in
            ``collection + "_revisions"``. One collection per database (and schema):
            a collection made for another database is a ``ConfigError``.
        prefer_grpc: Talk to the server over gRPC.
        timeout: Seconds a call to the server may take.
        client: An ``AsyncQdrantClient`` of your own (not closed by the store).
        retry_after: Seconds Qdrant is left alone after a failure (searches use the
            database's own index meanwhile) before it is tried again.

    Raises:
        ConfigError: Not exactly one of ``path``/``url``/``client``, ``api_key``
            without ``url``, a bad collection name, or qdrant-client not installed.
    """

    def __init__(
        self,
        path: str | None = None,
        *,
        url: str | None = None,
        api_key: str | None = None,
        collection: str = "tenxstore_memories",
        prefer_grpc: bool = False,
        timeout: int = 10,
        client: AsyncQdrantClient | None = None,
        retry_after: float = 5.0,
    ) -> None:
        given = [n for n, v in (("path", path), ("url", url), ("client", client)) if v is not None]
        if len(given) != 1:
            raise ConfigError(
                "QdrantIndex takes exactly one of path= (local mode), url= (a server) "
                f"or client=, not {' and '.join(given) or 'none'}"
            )
        if api_key is not None and url is None:
            raise ConfigError("QdrantIndex: api_key= goes with url=")
        if not isinstance(collection, str) or not collection.strip():
            raise ConfigError(f"collection must be a non-empty str, not {collection!r}")
        if isinstance(retry_after, bool) or not isinstance(retry_after, (int, float)):
            raise ConfigError(f"retry_after must be a number of seconds, not {retry_after!r}")
        _client_module()
        self.path, self.url, self.collection = path, url, collection
        self.markers_collection = collection + "_revisions"
        self.retry_after = float(retry_after)
        self._options = {"api_key": api_key, "prefer_grpc": prefer_grpc, "timeout": timeout}
        self._client = client
        self.owns_client = client is None
        """Whether :meth:`aclose` closes the client (one made here)."""
        self.model_id: str | None = None
        self.dims: int | None = None
        self._ready = False
        self._down_until = 0.0

    def __repr__(self) -> str:
        where = (
            f"path={self.path!r}" if self.path else f"url={self.url!r}" if self.url else "client"
        )
        return f"QdrantIndex({where}, collection={self.collection!r})"

    @property
    def client(self) -> AsyncQdrantClient:
        """The ``AsyncQdrantClient`` (made at first use from ``path`` or ``url``)."""
        if self._client is None:
            qdrant_client = _client_module()
            if self.path is not None:
                self._client = qdrant_client.AsyncQdrantClient(path=self.path)
            else:
                self._client = qdrant_client.AsyncQdrantClient(
                    url=self.url, check_compatibility=False, **self._options
                )
        assert self._client is not None
        return self._client

    def bind(self, model_id: str, dims: int) -> None:
        """The embedding the store searches with (an index serves one store's model).

        Raises:
            ConfigError: The index is bound to another model already.
        """
        if self.model_id is not None and (self.model_id, self.dims) != (model_id, dims):
            raise ConfigError(
                f"this QdrantIndex serves embedding {self.model_id!r} ({self.dims} dims), "
                f"not {model_id!r} ({dims} dims): give each model its own collection"
            )
        self.model_id, self.dims = model_id, dims

    # -- health ------------------------------------------------------------------------

    @property
    def available(self) -> bool:
        """Whether Qdrant may be tried now (not within ``retry_after`` of a failure)."""
        return time.monotonic() >= self._down_until

    def failed(self, exc: BaseException, what: str) -> None:
        """Qdrant failed ``what``: left alone for ``retry_after`` seconds, said once."""
        if self.available:
            log.warning(
                "Qdrant (%r) failed %s (%s): searching the database's own index, and "
                "repairing what Qdrant missed when it is back (in %.0f s at the "
                "earliest; or run `tenxstore memories reindex`)",
                self,
                what,
                (str(exc).strip().splitlines() or [type(exc).__name__])[0],
                self.retry_after,
            )
        self._down_until = time.monotonic() + self.retry_after
        self._ready = False  # checked again (a collection wiped is made again) first

    async def call(self, what: str, work: Callable[[], Awaitable[T]]) -> T:
        """``work()``, any error of the client as :class:`IndexUnavailable`."""
        try:
            return await work()
        except ConfigError:
            raise
        except Exception as exc:  # the client's errors: HTTP, gRPC, local, closed
            raise IndexUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc

    # -- the collections -----------------------------------------------------------------

    async def ensure(self, store_id: str, *, recreate: bool = False) -> bool:
        """The collections exist, of this model, dims and database (made if missing;
        ``recreate``: made anew when they are of another model or dims); whether the
        points' collection was made now (then every marker is dropped: nothing is
        known to be in it).

        Raises:
            ConfigError: The collection is of another model, dims or database.
            IndexUnavailable: Qdrant failed.
        """
        return await self.call("setup", lambda: self._ensure(store_id, recreate))

    async def _ensure(self, store_id: str, recreate: bool) -> bool:
        from qdrant_client import models

        assert self.model_id is not None and self.dims is not None
        client = self.client
        made = False
        if await client.collection_exists(self.collection):
            meta = await self._meta()
            size = (await client.get_collection(self.collection)).config.params.vectors
            dims = getattr(size, "size", None)
            wanted = {"model_id": self.model_id, "dims": self.dims}
            found = None if meta is None else {k: meta.get(k) for k in wanted}
            if (found not in (None, wanted) or dims != self.dims) and recreate:
                await client.delete_collection(self.collection)
            else:
                self._check(meta, dims, store_id)
        if not await client.collection_exists(self.collection):
            await client.create_collection(
                self.collection,
                vectors_config=models.VectorParams(size=self.dims, distance=models.Distance.COSINE),
            )
            if self.path is None:  # local mode ignores them (and warns)
                for field, kind in (
                    ("user", models.PayloadSchemaType.KEYWORD),
                    ("namespace", models.PayloadSchemaType.KEYWORD),
                    ("ns_path", models.PayloadSchemaType.KEYWORD),
                    ("expires_at", models.PayloadSchemaType.FLOAT),
                ):
                    await client.create_payload_index(self.collection, field, kind)
            made = True
        if made and await client.collection_exists(self.markers_collection):
            await client.delete_collection(self.markers_collection)  # nothing is in it
        if not await client.collection_exists(self.markers_collection):
            await client.create_collection(
                self.markers_collection,
                vectors_config=models.VectorParams(size=1, distance=models.Distance.DOT),
            )
        payload = {"kind": "meta", "model_id": self.model_id, "dims": self.dims}
        await client.upsert(
            self.markers_collection,
            [models.PointStruct(id=_META, vector=[1.0], payload={**payload, "store": store_id})],
        )
        self._ready = True
        return made

    def _check(self, meta: dict[str, Any] | None, dims: Any, store_id: str) -> None:
        """The existing collection is this store's model, dims and database."""
        name = self.collection
        if dims != self.dims or (meta is not None and meta.get("model_id") != self.model_id):
            model = None if meta is None else meta.get("model_id")
            raise ConfigError(
                f"Qdrant collection {name!r} holds vectors of {model!r} ({dims} dims), not "
                f"of the store's embedding {self.model_id!r} ({self.dims} dims): reindex "
                "(MemoryStore.areindex, `tenxstore memories reindex`) makes it anew, or "
                "give the store another collection"
            )
        if meta is not None and meta.get("store") not in (None, store_id):
            raise ConfigError(
                f"Qdrant collection {name!r} holds the memories of another database "
                f"(store id {meta.get('store')!r}, not {store_id!r}): give each database "
                "its own collection"
            )

    async def _meta(self) -> dict[str, Any] | None:
        client = self.client
        if not await client.collection_exists(self.markers_collection):
            return None
        found = await client.retrieve(self.markers_collection, [_META], with_payload=True)
        return dict(found[0].payload or {}) if found else None

    @property
    def ready(self) -> bool:
        """Whether :meth:`ensure` ran since the last failure."""
        return self._ready

    # -- markers ---------------------------------------------------------------------------

    def _scope_filter(self, users: Any, namespace: str | None, *, exact: bool = False) -> Any:
        from qdrant_client import models

        must: list[Any] = []
        if users is not None:
            must.append(
                models.FieldCondition(key="user", match=models.MatchValue(value=str(users)))
            )
        if namespace:
            field = "namespace" if exact else "ns_path"
            must.append(models.FieldCondition(key=field, match=models.MatchValue(value=namespace)))
        return models.Filter(must=must)

    async def markers(self, users: Any, namespace: str | None) -> dict[tuple[str, str], int]:
        """The revisions the scope's (user, namespace) pairs were brought to."""
        from qdrant_client import models

        scope = self._scope_filter(users, namespace)
        kind = models.FieldCondition(key="kind", match=models.MatchValue(value="scope"))
        scope.must.append(kind)
        found: dict[tuple[str, str], int] = {}
        for p in await self._scroll(self.markers_collection, scope, True):
            payload = p.payload or {}
            found[(str(payload["user"]), str(payload["namespace"]))] = int(payload["revision"])
        return found

    async def marker(self, user: str, namespace: str) -> int | None:
        """The revision one (user, namespace) was brought to, or None."""
        ident = marker_id(user, namespace)
        found = await self.call(
            "read a marker",
            lambda: self.client.retrieve(self.markers_collection, [ident], with_payload=True),
        )
        return int((found[0].payload or {})["revision"]) if found else None

    async def set_marker(self, user: str, namespace: str, revision: int | None) -> None:
        """Mark (user, namespace) as brought to ``revision`` (None: no marker)."""
        from qdrant_client import models

        ident = marker_id(user, namespace)
        if revision is None:
            await self.call(
                "drop a marker",
                lambda: self.client.delete(
                    self.markers_collection, models.PointIdsList(points=[ident])
                ),
            )
            return
        payload = {
            "kind": "scope",
            "user": user,
            "namespace": namespace,
            "ns_path": ns_path(namespace),
            "revision": revision,
        }
        point = models.PointStruct(id=ident, vector=[1.0], payload=payload)
        await self.call(
            "write a marker", lambda: self.client.upsert(self.markers_collection, [point])
        )

    async def scopes(self) -> set[tuple[str, str]]:
        """The (user, namespace) of every point."""
        found = await self._scroll(self.collection, None, ["user", "namespace"])
        return {(str(p.payload["user"]), str(p.payload["namespace"])) for p in found if p.payload}

    async def drop_markers(self, keep: Iterable[tuple[str, str]]) -> int:
        """Delete the markers of every (user, namespace) but ``keep``; how many."""
        from qdrant_client import models

        kept = {marker_id(u, n) for u, n in keep}
        scope = models.Filter(
            must=[models.FieldCondition(key="kind", match=models.MatchValue(value="scope"))]
        )
        gone = [p.id for p in await self._scroll(self.markers_collection, scope, False)]
        gone = [i for i in gone if str(i) not in kept]
        await self._delete(self.markers_collection, gone)
        return len(gone)

    # -- points ----------------------------------------------------------------------------

    async def upsert(self, points: Sequence[Point]) -> None:
        """Write the points (each replacing the memory's)."""
        if not points:
            return
        from qdrant_client import models

        structs = [
            models.PointStruct(
                id=point_id(p.user, p.namespace, p.key),
                vector=p.vector,
                payload={
                    "user": p.user,
                    "namespace": p.namespace,
                    "ns_path": ns_path(p.namespace),
                    "key": p.key,
                    "memory_id": p.memory_id,
                    "expires_at": p.expires_at,
                    "rev": p.rev,
                },
            )
            for p in points
        ]
        await self.call(
            "write points", lambda: self.client.upsert(self.collection, structs, wait=True)
        )

    async def delete(self, ids: Sequence[str]) -> None:
        """Delete points by id (those missing aside)."""
        await self._delete(self.collection, ids)

    async def _delete(self, collection: str, ids: Sequence[Any]) -> None:
        if not ids:
            return
        from qdrant_client import models

        for start in range(0, len(ids), SCROLL):
            chunk = list(ids[start : start + SCROLL])
            await self.call(
                "delete points",
                lambda chunk=chunk: self.client.delete(  # type: ignore[misc]
                    collection, models.PointIdsList(points=chunk), wait=True
                ),
            )

    async def points(self, user: Any, namespace: str | None) -> dict[str, tuple[str, Any]]:
        """The points of one (user, namespace) (``None``/``""``: all): id to (rev,
        expires_at)."""
        scope = self._scope_filter(user, namespace, exact=True)
        found = await self._scroll(self.collection, scope, ["rev", "expires_at"])
        return {
            str(p.id): (str((p.payload or {}).get("rev")), (p.payload or {}).get("expires_at"))
            for p in found
        }

    async def _scroll(self, collection: str, scope: Any, payload: Any) -> list[Any]:
        out: list[Any] = []
        offset: Any = None
        while True:
            page, offset = await self.call(
                "read points",
                lambda offset=offset: self.client.scroll(  # type: ignore[misc]
                    collection,
                    scroll_filter=scope,
                    limit=SCROLL,
                    offset=offset,
                    with_payload=payload,
                    with_vectors=False,
                ),
            )
            out.extend(page)
            if offset is None:
                return out

    async def nearest(
        self, vector: list[float], users: Any, namespace: str | None, now: float, count: int
    ) -> list[tuple[int, str, float, str, str]]:
        """The ``count`` points of the scope closest to ``vector``, not expired at
        ``now``: (memory id, rev, cosine similarity, user, namespace), closest first."""
        from qdrant_client import models

        scope = self._scope_filter(users, namespace)
        scope.must.append(
            models.Filter(
                should=[
                    models.IsNullCondition(is_null=models.PayloadField(key="expires_at")),
                    models.FieldCondition(key="expires_at", range=models.Range(gt=now)),
                ]
            )
        )
        found = await self.call(
            "search",
            lambda: self.client.query_points(
                self.collection,
                query=vector,
                query_filter=scope,
                limit=count,
                with_payload=["memory_id", "rev", "user", "namespace"],
            ),
        )
        out = []
        for p in found.points:
            got = p.payload or {}
            out.append(
                (
                    int(got["memory_id"]),
                    str(got["rev"]),
                    float(p.score),
                    got["user"],
                    got["namespace"],
                )
            )
        return out

    async def aclose(self) -> None:
        """Close the client, if this index made it."""
        if self.owns_client and self._client is not None:
            client, self._client = self._client, None
            self._ready = False
            try:
                await client.close()
            except Exception as exc:  # closing a client that failed: nothing to keep
                log.debug("closing the Qdrant client: %s", exc)
