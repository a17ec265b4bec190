"""Encryption at rest: AES-256-GCM under a key ring (the ``crypto`` extra).

A :class:`KeyRing` holds named 256-bit keys; one seals (the first, or the one named by
``sealing=``), every one opens. Give it in code
(``CheckpointRepository(..., keys=KeyRing(...))``) or by environment:
``TENXSTORE_KEYS="k1:<base64 key>,k2:<base64 key>"`` and, optionally,
``TENXSTORE_SEALING_KEY=k2`` (read when ``keys`` is not given). A key that opens but
does not seal yet is what a rolling key rotation needs: every instance can open what
any other seals before any of them seals under the new key (docs/encryption.md).

A stored value is *sealed* into an envelope that records its format version, the key
id and the nonce. The payload columns hold JSON text written by :mod:`tenxstore.serde`,
so the text envelope is text too::

    !tx2:<key id>:<base64 of nonce (12 bytes) + ciphertext + tag (16 bytes)>

(``!tx1:`` is the format before ``tx2``: it still opens, and ``rotate-keys`` seals it
again as ``tx2``.)

Telling an envelope from a plaintext value is exact, not a guess: every payload text
tenxstore writes is :func:`tenxstore.serde.encode` output, which is either orjson's
JSON (it begins with ``{ [ " - 0-9 t f n``: a JSON value, no leading whitespace) or the
standard library's JSON after one space (serde's mark). ``!`` begins none of these,
so a value that begins with ``!`` is an envelope and anything else is a plaintext row
written before encryption was turned on (read as it is).

The associated data of every envelope binds it to its place: the envelope's header,
the column it belongs to (``states.state_data``, ``messages.payload``, ``cache``...),
the thread's life — its incarnation and its owner (:class:`Life`) — and the thread id.
A ciphertext copied into another thread, another column, another life of the thread
(deleted and created again, or replaced by an import) or a thread row given to another
owner, a tampered byte, or a key that is not the one that sealed it fails to open with
:class:`~tenxstore.errors.DecryptionError` naming the thread, the column and the key
id — never garbage, never the ciphertext passed off as plaintext. A ``tx1`` envelope's
associated data names no life (the format it was sealed in): it opens in any life of
its thread, which is why ``rotate-keys`` seals it again.
"""

from __future__ import annotations

import binascii
import os
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

# The envelope format is envelopes.py's, keys as given keyconfig.py's. What other
# modules import from here is imported from there (``X as X``: re-exported, as when
# it was defined here).
from .envelopes import (
    BYTES_HEAD,
    MARK,
    NONCE,
    OLD_VERSION,
    TAG,
    VERSION,
    aad_prefix,
    check_type,
    from_b64,
    is_sealed,
    life_tag,
    sealed_key_id,
    text_envelope,
    thread_tag,
    to_b64,
    typed_aad,
)
from .envelopes import MAX_TYPE as MAX_TYPE
from .envelopes import OLD_BYTES_HEAD as OLD_BYTES_HEAD
from .envelopes import OLD_HEAD as OLD_HEAD
from .envelopes import bytes_head as bytes_head
from .envelopes import bytes_heads as bytes_heads
from .envelopes import bytes_key_id as bytes_key_id
from .envelopes import sealed_version as sealed_version
from .envelopes import text_head as text_head
from .envelopes import text_heads as text_heads
from .errors import ConfigError, DecryptionError
from .extras import require_extra
from .keyconfig import (
    ENV,
    ENVELOPE_ENV,
    KEY_BYTES,
    REQUIRE_ENV,
    SEALING_ENV,
    checked_pairs,
    env_ring,
    parsed_pairs,
    shown,
)

__all__ = [
    "ENV",
    "ENVELOPE_ENV",
    "REQUIRE_ENV",
    "SEALING_ENV",
    "KeyRing",
    "Life",
    "check_type",
    "is_sealed",
    "life_of",
    "open_json",
    "open_text",
    "open_typed",
    "sealed_key_id",
]


# The columns an envelope is bound to (its associated data names one of them).
STATE = "states.state_data"
META = "states.meta"
MESSAGE = "messages.payload"
ARGS = "tool_executions.args"
RESULT = "tool_executions.result"
ERROR = "tool_executions.error"
NAME = "threads.name"
METADATA = "threads.metadata"
CACHE = "cache"
CHECKPOINT = "lg_checkpoints.checkpoint"
WRITE = "lg_writes.value"
BLOB = "lg_blobs.blob"
EXPORT = "export"  # a sealed line of an export file (tenxstore export --sealed)
# A memory's values (current and past versions alike), bound to the memory's uid.
MEMORY_CONTENT = "memories.content"
MEMORY_METADATA = "memories.metadata"
# The columns whose associated-data prefix a ring keeps (a cache entry's "column" names
# its version and key too: one of its own per entry, never kept).
_KEPT_PREFIXES = frozenset(
    (
        STATE,
        META,
        MESSAGE,
        ARGS,
        RESULT,
        ERROR,
        NAME,
        METADATA,
        EXPORT,
        MEMORY_CONTENT,
        MEMORY_METADATA,
    )
)


class Life(NamedTuple):
    """Which life of a thread a value is sealed for: the thread row's ``incarnation``
    (a new one each time the thread id is created again: after a delete, or when an
    import replaces it) and its ``owner`` — the row's ``user_id``, exactly as stored
    (None: a thread of no user, under ``enforce_user_isolation=False``)."""

    incarnation: int
    owner: Any


def life_of(row: Any) -> Life:
    """The life of the thread a row read with ``threads.incarnation`` and
    ``threads.user_id`` belongs to."""
    return Life(row.incarnation, row.user_id)


class KeyRing:
    """Named AES-256 keys: one seals (the first, unless ``sealing`` names another),
    every one opens.

    Args:
        keys: ``(key_id, key)`` pairs (tuples or lists) or a mapping.
            A key is 32 bytes, or their base64 text. Key ids are 1 to 64 characters of
            ``A-Z a-z 0-9 _ . -`` and unique, also ignoring case (``"k1"`` and ``"K1"``
            in one ring are refused: some databases compare text without case).
        sealing: The id of the key that seals new values (exactly as in ``keys``);
            None: the first. Every other key only opens: a key rotation adds the new
            key everywhere first, and makes it the sealing key once every instance can
            open what it seals (docs/encryption.md).
        require_sealed: Strict mode: a stored value that is not sealed (plaintext
            written before encryption was on, or plaintext substituted for a sealed
            value by someone who can write to the database or Redis) raises
            :class:`~tenxstore.errors.DecryptionError` when read (a cache entry is a
            miss), instead of being read as it is. Turn it on once ``rotate-keys`` has
            sealed every row.
        envelope: The format new values are sealed in: ``"tx2"`` (the default: bound
            to the thread's life, see :class:`Life`), or ``"tx1"``, the format of
            releases before it, which they can open — only while a running deployment
            is upgraded to this release, so that the instances not yet updated can
            read what the updated ones write (docs/encryption.md). Both are opened
            whatever this says.

    Raises:
        ConfigError: No key, a bad id, a repeated id, a key that is not 32 bytes, a
            ``sealing`` id that is not in the ring, an ``envelope`` that is not
            ``"tx1"`` or ``"tx2"``, or the ``cryptography`` package is
            missing (a ``MissingExtra``: ``pip install "tenxstore[crypto]"``).
            It names the entry by its place and never shows what the entry holds (an id
            only when it cannot be a key: see :data:`_SHOWN_ID`).
    """

    def __init__(
        self,
        keys: Mapping[str, str | bytes] | Iterable[tuple[str, str | bytes]],
        *,
        sealing: str | None = None,
        require_sealed: bool = False,
        envelope: str = VERSION,
    ):
        require_extra("crypto", "cryptography", needed_by="encryption (keys=)")
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        if isinstance(keys, (str, bytes)):
            raise ConfigError("keys must be (key_id, key) pairs or a mapping; see KeyRing.parse")
        if not isinstance(require_sealed, bool):
            raise ConfigError(f"require_sealed must be a bool, not {require_sealed!r}")
        self.require_sealed = require_sealed
        """Whether a value that is not sealed is refused when read (strict mode)."""
        if envelope not in (VERSION, OLD_VERSION):
            raise ConfigError(
                f"envelope must be {VERSION!r} or {OLD_VERSION!r}, not {str(envelope)[:16]!r}"
            )
        self.envelope = envelope
        """The format new values are sealed in (``"tx2"``; ``"tx1"`` during an upgrade)."""
        self._pairs: list[tuple[str, bytes]] = checked_pairs(keys)  # for pickling
        self._ciphers: dict[str, Any] = {key_id: AESGCM(raw) for key_id, raw in self._pairs}
        self._seal_under(self._pairs[0][0] if sealing is None else sealing, "sealing=")
        # (header, column) -> the associated data's bytes before the thread id: a read
        # joins one piece to it. Bounded: the headers of this ring's keys (a header is
        # looked up only once its key is found in the ring), the columns of _KEPT_PREFIXES.
        self._prefixes: dict[tuple[str, str], bytes] = {}

    def _seal_under(self, sealing: object, what: str) -> None:
        """Make ``sealing`` the key that seals: exactly an id of the ring (a database
        may compare ids without case, but rotation and the key counts compare exactly,
        so ``"K1"`` never stands for ``"k1"``)."""
        if not isinstance(sealing, str):
            raise ConfigError(f"{what} must be a key id (a str), not {type(sealing).__name__}")
        if sealing not in self._ciphers:
            # ids are named only when they cannot be keys: a key pasted where its id
            # belongs is never repeated into a log
            named = shown(sealing) or "a key id (not shown)"
            ids = ", ".join(shown for shown in map(shown, self._ciphers) if shown)
            like = [k for k in self._ciphers if k.lower() == sealing.lower()]
            hint = f"; {shown(like[0])} differs from it in case" if like else ""
            raise ConfigError(
                f"{what} names {named}, which is not a key of the ring ({ids or 'ids not shown'})"
                f"{hint}: the sealing key must be in the ring, spelled exactly as there"
            )
        self._current: str = sealing
        self._head = f"{MARK}{self.envelope}:{sealing}:"
        self._bytes_head = self.envelope.encode() + bytes([len(sealing)]) + sealing.encode()
        self._bound = self.envelope == VERSION  # whether what it seals names the life
        self._sealer = self._ciphers[sealing]

    @classmethod
    def parse(
        cls,
        text: str,
        *,
        sealing: str | None = None,
        require_sealed: bool = False,
        envelope: str = VERSION,
    ) -> KeyRing:
        """A key ring from ``"key_id:base64key,key_id:base64key"`` (the first seals,
        unless ``sealing`` names another).

        Raises:
            ConfigError: Malformed text or keys, or ``sealing`` not in the ring.
        """
        pairs = parsed_pairs(text)
        return cls(pairs, sealing=sealing, require_sealed=require_sealed, envelope=envelope)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KeyRing | None:
        """The key ring ``TENXSTORE_KEYS`` gives, or None when it is unset or empty;
        sealing under the key ``TENXSTORE_SEALING_KEY`` names (unset: the first);
        strict (:attr:`require_sealed`) when ``TENXSTORE_REQUIRE_SEALED`` is ``1``;
        sealing in the format ``TENXSTORE_ENVELOPE`` names (unset: ``tx2``).

        Raises:
            ConfigError: Malformed keys, ``TENXSTORE_SEALING_KEY`` naming no key of
                the ring (or set without ``TENXSTORE_KEYS``),
                ``TENXSTORE_REQUIRE_SEALED`` not one of ``1 true yes 0 false no`` (or
                empty), or ``TENXSTORE_ENVELOPE`` not ``tx1`` or ``tx2`` (or set
                without ``TENXSTORE_KEYS``).
        """
        given = env_ring(os.environ if environ is None else environ)
        if given is None:
            return None
        ring = cls.parse(given.text, require_sealed=given.require_sealed, envelope=given.envelope)
        if given.sealing is not None:
            ring._seal_under(given.sealing, f"{SEALING_ENV} (for {ENV})")
        return ring

    @staticmethod
    def generate_key() -> str:
        """A new random key as base64 text, for ``TENXSTORE_KEYS``."""
        return binascii.b2a_base64(os.urandom(KEY_BYTES), newline=False).decode("ascii")

    @property
    def current(self) -> str:
        """The id of the key that seals (``sealing``, or the first; a ring's keys are
        fixed when it is made: a new ring changes them)."""
        return self._current

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Every key id, the sealing key first, the others in the ring's order."""
        return (self._current, *(k for k in self._ciphers if k != self._current))

    @property
    def head(self) -> str:
        """What a text this ring seals now begins with (``!tx2:<sealing key id>:``):
        rotation compares stored values to it in SQL."""
        return self._head

    @property
    def bytes_head(self) -> bytes:
        """What a LangGraph value's bytes this ring seals now begin with."""
        return self._bytes_head

    def __reduce__(self) -> tuple[Any, ...]:
        return (_ring, (self._pairs, self.require_sealed, self._current, self.envelope))

    def __repr__(self) -> str:  # never the keys
        strict = ", require_sealed=True" if self.require_sealed else ""
        old = f", envelope={self.envelope!r}" if self.envelope != VERSION else ""
        return f"KeyRing(key_ids={self.key_ids!r}, sealing={self._current!r}{strict}{old})"

    def _plain(self, thread_id: Any, column: str) -> None:
        """A value that is not sealed, read: refused in strict mode."""
        if self.require_sealed:
            raise DecryptionError(
                thread_id, column, None, "not encrypted, and the key ring requires sealed values"
            )

    def seal(self, text: str, thread_id: Any, column: str, life: Life | None = None) -> str:
        """``text`` encrypted under the current key (a ``tx2`` envelope), bound to
        ``thread_id``, ``column`` and ``life``: the incarnation and owner of the thread
        it is stored in (None: bound to no life, for a value that moves between stores
        and lives, as a sealed export line does; it then opens only with no life). A
        ring sealing ``tx1`` (:attr:`envelope`) binds no life."""
        nonce = os.urandom(NONCE)
        bound = life_tag(life) if self._bound else b""
        aad = self._prefix(self._head, column) + bound + thread_tag(thread_id)
        sealed = self._sealer.encrypt(nonce, text.encode("utf-8", "surrogatepass"), aad)
        return self._head + to_b64(nonce + sealed)

    def open(self, text: str, thread_id: Any, column: str, life: Life | None = None) -> str:
        """The plaintext of a stored text: an envelope opened, plaintext as it is
        (unless :attr:`require_sealed`).

        Args:
            text: The stored text.
            thread_id: The thread it is stored in.
            column: Its column (one of this module's constants).
            life: The life of the thread it is stored in, read with it (a ``tx2``
                envelope opens only in the life it was sealed for; a ``tx1`` one names
                none, and opens in any).

        Raises:
            DecryptionError: The envelope is damaged, names a key not in the ring, or
                does not authenticate (tampered, another key, another thread, column,
                life or owner); or the text is not sealed and the ring requires sealed
                values.
        """
        if text[:1] != MARK:
            self._plain(thread_id, column)
            return text
        plain = self._open_envelope(text, thread_id, column, life)
        return plain.decode("utf-8", "surrogatepass")

    def open_json(
        self, text: str, thread_id: Any, column: str, life: Life | None = None
    ) -> str | bytes:
        """:meth:`open` for text that goes straight to :func:`tenxstore.serde.decode`:
        an opened envelope stays UTF-8 bytes (orjson reads them as they are: no copy
        into a ``str`` on the read path); text the standard library wrote (which may
        hold surrogates, see :mod:`tenxstore.serde`) is decoded as :meth:`open` does."""
        if text[:1] != MARK:
            self._plain(thread_id, column)
            return text
        plain = self._open_envelope(text, thread_id, column, life)
        return plain.decode("utf-8", "surrogatepass") if plain[:1] == b" " else plain

    def _prefix(self, head: str, column: str) -> bytes:
        found = self._prefixes.get((head, column))
        if found is None:
            found = aad_prefix(head, column)
            if column in _KEPT_PREFIXES:
                self._prefixes[(head, column)] = found
        return found

    def _open_envelope(self, text: str, thread_id: Any, column: str, life: Life | None) -> bytes:
        if text.startswith(self._head):  # the current key's, in the ring's format: most reads
            key_id, head, cipher, version = self._current, self._head, self._sealer, self.envelope
        else:
            found = text_envelope(text)
            if found is None:
                raise DecryptionError(thread_id, column, None, "not a tenxstore envelope")
            version, key_id = found
            head = f"{MARK}{version}:{key_id}:"
            cipher = self._ciphers.get(key_id)
            if cipher is None:
                raise DecryptionError(thread_id, column, key_id, "that key is not in the key ring")
        try:
            raw = memoryview(from_b64(text[len(head) :]))
        except (binascii.Error, ValueError):
            raise DecryptionError(thread_id, column, key_id, "damaged envelope") from None
        if len(raw) < NONCE + TAG:
            raise DecryptionError(thread_id, column, key_id, "truncated envelope")
        # a tx1 envelope's associated data names no life: it was sealed before tx2
        bound = b"" if version == OLD_VERSION else life_tag(life)
        aad = self._prefix(head, column) + bound + thread_tag(thread_id)
        try:  # views of the decoded bytes: the ciphertext is not copied again
            plain: bytes = cipher.decrypt(raw[:NONCE], raw[NONCE:], aad)
        except Exception:  # cryptography's InvalidTag: tampered, wrong key or wrong place
            raise DecryptionError(
                thread_id, column, key_id, "authentication failed (tampered, or moved)"
            ) from None
        return plain

    def seal_typed(
        self, kind: str, data: bytes, thread_id: Any, column: str, life: Life | None = None
    ) -> tuple[str, bytes]:
        """A LangGraph ``(type, bytes)`` sealed: the type marked ``!`` (see
        :func:`check_type`), the bytes ``tx2``, the key id's length and the key id, the
        nonce, the ciphertext and tag. The plain type is part of the associated data,
        with the thread's ``life`` (as in :meth:`seal`).

        Raises:
            SerializationError: The type begins with ``!`` or is over 63 characters
                (the mark makes it one longer, and the column holds 64).
        """
        check_type(kind, sealed=True)
        head = self._bytes_head
        nonce = os.urandom(NONCE)
        aad = typed_aad(head, kind, column, thread_id, life)
        return MARK + kind, head + nonce + self._sealer.encrypt(nonce, data, aad)

    def open_typed(
        self, kind: str, data: bytes, thread_id: Any, column: str, life: Life | None = None
    ) -> tuple[str, bytes]:
        """A stored ``(type, bytes)`` opened (plaintext as it is, unless
        :attr:`require_sealed`).

        Raises:
            DecryptionError: As :meth:`open`.
        """
        if kind[:1] != MARK:
            self._plain(thread_id, column)
            return kind, data
        plain_kind = kind[1:]
        key_id = bytes_key_id(data)
        if key_id is None:
            raise DecryptionError(thread_id, column, None, "not a tenxstore envelope")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise DecryptionError(thread_id, column, key_id, "that key is not in the key ring")
        at = len(BYTES_HEAD) + 1 + len(key_id)
        if len(data) < at + NONCE + TAG:
            raise DecryptionError(thread_id, column, key_id, "truncated envelope")
        try:
            plain: bytes = cipher.decrypt(
                data[at : at + NONCE],
                data[at + NONCE :],
                typed_aad(data[:at], plain_kind, column, thread_id, life),
            )
        except Exception:  # InvalidTag
            raise DecryptionError(
                thread_id, column, key_id, "authentication failed (tampered, or moved)"
            ) from None
        return plain_kind, plain

    def is_current(self, text: str) -> bool:
        """Whether a stored text is sealed under the current key in the ring's format
        (rotation skips it; a ``tx1`` envelope is sealed again as ``tx2``)."""
        return text.startswith(self._head)


def _ring(
    pairs: list[tuple[str, bytes]],
    require_sealed: bool,
    sealing: str | None = None,
    envelope: str = VERSION,
) -> KeyRing:
    """A key ring unpickled (in another process; ``sealing`` absent: pickled by a
    release that sealed under the first key; ``envelope`` absent: by one before tx2)."""
    return KeyRing(pairs, sealing=sealing, require_sealed=require_sealed, envelope=envelope)


def open_typed(
    keys: KeyRing | None,
    kind: str,
    data: bytes,
    thread_id: Any,
    column: str,
    life: Life | None = None,
) -> tuple[str, bytes]:
    """A stored LangGraph ``(type, bytes)`` opened with or without a key ring (without
    one, a sealed value raises :class:`~tenxstore.errors.DecryptionError`)."""
    if keys is not None:
        return keys.open_typed(kind, data, thread_id, column, life)
    if kind[:1] == MARK:
        raise DecryptionError(
            thread_id, column, bytes_key_id(data), "encrypted, and no key ring is configured"
        )
    return kind, data


def open_text(
    keys: KeyRing | None, text: str, thread_id: Any, column: str, life: Life | None = None
) -> str:
    """The plaintext of a stored text with or without a key ring: without one, an
    envelope raises :class:`~tenxstore.errors.DecryptionError` instead of being read
    as JSON."""
    if keys is not None:
        return keys.open(text, thread_id, column, life)
    if text[:1] == MARK:
        raise DecryptionError(
            thread_id, column, sealed_key_id(text), "encrypted, and no key ring is configured"
        )
    return text


def open_json(
    keys: KeyRing | None, text: str, thread_id: Any, column: str, life: Life | None = None
) -> str | bytes:
    """:func:`open_text` for text that goes straight to :func:`tenxstore.serde.decode`
    (an opened envelope may stay bytes: see :meth:`KeyRing.open_json`)."""
    if keys is not None:
        return keys.open_json(text, thread_id, column, life)
    return open_text(None, text, thread_id, column)
