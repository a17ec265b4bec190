"""The sealed envelope format (see :mod:`tenxstore.crypto`): its heads and key ids,
the associated data that binds an envelope to its place (column, thread, life), and
the ``!`` mark of a sealed LangGraph type. :class:`~tenxstore.crypto.KeyRing` seals
and opens with these; rotation and the key counts compare stored values to the heads.

A text envelope is ``!tx2:<key id>:<base64 of nonce + ciphertext + tag>`` (``!tx1:``
before ``tx2``); a LangGraph value's bytes begin ``tx2`` (or ``tx1``), the key id's
length and the key id, then the nonce, the ciphertext and the tag.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, SerializationError

if TYPE_CHECKING:  # Life stays crypto's: the public value type, pickled by that name
    from .crypto import Life

try:  # SIMD base64 (the crypto extra installs it): ~15x the standard library's speed
    import pybase64

    def to_b64(data: bytes) -> str:
        return pybase64.b64encode_as_string(data)

    def from_b64(text: str) -> bytes:
        return pybase64.b64decode(text, validate=True)

except ImportError:  # pragma: no cover - the same output, slower

    def to_b64(data: bytes) -> str:
        return binascii.b2a_base64(data, newline=False).decode("ascii")

    def from_b64(text: str) -> bytes:
        return base64.b64decode(text, validate=True)


__all__ = [
    "MAX_TYPE",
    "bytes_head",
    "bytes_heads",
    "check_type",
    "is_sealed",
    "sealed_key_id",
    "sealed_version",
    "text_head",
    "text_heads",
]

MAX_TYPE = 64
"""Characters of a LangGraph value's type column; a sealed type takes one more (``!``)."""
MARK = "!"
VERSION = "tx2"  # what is sealed: the associated data names the thread's life
OLD_VERSION = "tx1"  # before tx2: opened (its associated data names no life), not sealed
HEAD = f"{MARK}{VERSION}:"
OLD_HEAD = f"{MARK}{OLD_VERSION}:"
BYTES_HEAD = VERSION.encode()
OLD_BYTES_HEAD = OLD_VERSION.encode()
_HEAD_SIZE = len(HEAD)  # both formats' heads are as long: one slice tells them apart
KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
NONCE = 12
TAG = 16


def text_head(key_id: str) -> str:
    """What a text envelope sealed under ``key_id`` now begins with (``!tx2:<key
    id>:``): rotation compares stored values to it in SQL (a ``tx1`` one is sealed
    again)."""
    return f"{HEAD}{key_id}:"


def text_heads(key_id: str) -> tuple[str, str]:
    """What a text envelope under ``key_id`` begins with, in either format (``tx2``,
    ``tx1``): the key counts compare stored values to both."""
    return f"{HEAD}{key_id}:", f"{OLD_HEAD}{key_id}:"


def bytes_head(key_id: str) -> bytes:
    """What a LangGraph value's bytes sealed under ``key_id`` now begin with (``tx2``,
    the key id's length, the key id)."""
    return BYTES_HEAD + bytes([len(key_id)]) + key_id.encode()


def bytes_heads(key_id: str) -> tuple[bytes, bytes]:
    """:func:`bytes_head` in either format (``tx2``, ``tx1``)."""
    tail = bytes([len(key_id)]) + key_id.encode()
    return BYTES_HEAD + tail, OLD_BYTES_HEAD + tail


def is_sealed(text: str) -> bool:
    """Whether a stored text is an envelope (see the module's proof), not plaintext JSON."""
    return text[:1] == MARK


def text_envelope(text: str) -> tuple[str, str] | None:
    """(format version, key id) of a text envelope, or None when it is too damaged to
    name a key (see :func:`sealed_key_id`)."""
    head = text[:_HEAD_SIZE]
    if head != HEAD and head != OLD_HEAD:
        return None
    end = text.find(":", _HEAD_SIZE, _HEAD_SIZE + 65)
    key_id = text[_HEAD_SIZE:end] if end > 0 else ""
    return (head[1:-1], key_id) if KEY_ID.fullmatch(key_id) else None


def sealed_key_id(text: str) -> str | None:
    """The key id an envelope (of either format) names; None for plaintext, or for an
    envelope too damaged to name one — what stands where a key id should is not a key
    id's characters (it is then never repeated in an error or a report: it may be a
    stored value's text)."""
    found = text_envelope(text)
    return None if found is None else found[1]


def sealed_version(text: str) -> str | None:
    """The format an envelope is in (``"tx2"``, or the older ``"tx1"``), or None (see
    :func:`sealed_key_id`)."""
    found = text_envelope(text)
    return None if found is None else found[0]


def thread_tag(thread_id: Any) -> bytes:
    return str(thread_id).encode("utf-8", "surrogatepass")


_NO_LIFE = b"\x00"


def life_tag(life: Life | None) -> bytes:
    """A ``tx2`` envelope's life in its associated data: the incarnation in decimal,
    then the owner length-prefixed (``=`` and its text: an owner of any characters,
    or none, splits back unambiguously), each ended by a NUL; or one NUL for a value
    bound to no life (a sealed export line, which travels between stores)."""
    if life is None:
        return _NO_LIFE
    incarnation, owner = life
    if type(incarnation) is not int:  # not a bool, not a str of digits: a typed error
        raise ConfigError(f"a Life's incarnation must be an int, not {type(incarnation).__name__}")
    named = b"" if owner is None else b"=" + str(owner).encode("utf-8", "surrogatepass")
    return b"%d\x00%d:%s\x00" % (incarnation, len(named), named)


def aad_prefix(head: str, column: str) -> bytes:
    """The associated data of a text envelope before its life and thread id: the
    envelope's header and the column (tenxstore's own names, no NUL); the thread id
    comes last, so the joined bytes split back unambiguously."""
    return b"tenxstore\x00" + head.encode() + b"\x00" + column.encode() + b"\x00"


def typed_aad(head: bytes, kind: str, column: str, thread_id: Any, life: Life | None) -> bytes:
    """A LangGraph value's associated data: its envelope header, plain type, column,
    life (``tx2`` only: a ``tx1`` value's names none) and thread id (last, as in
    :func:`aad_prefix`)."""
    return (
        b"tenxstore\x00"
        + head
        + b"\x00"
        + kind.encode("utf-8", "surrogatepass")
        + b"\x00"
        + column.encode()
        + b"\x00"
        + (b"" if head.startswith(OLD_BYTES_HEAD) else life_tag(life))
        + thread_tag(thread_id)
    )


def bytes_key_id(data: bytes) -> str | None:
    """The key id a LangGraph value's envelope (of either format) names, or None."""
    head = data[: len(BYTES_HEAD)]
    if (head != BYTES_HEAD and head != OLD_BYTES_HEAD) or len(data) <= len(BYTES_HEAD):
        return None
    size = data[len(BYTES_HEAD)]
    raw = data[len(BYTES_HEAD) + 1 : len(BYTES_HEAD) + 1 + size]
    try:
        key_id = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    return key_id if len(raw) == size and KEY_ID.fullmatch(key_id) else None


def check_type(kind: str, *, sealed: bool = False) -> str:
    """A serializer's type as it may be stored: never one that begins with ``!``,
    which marks a sealed LangGraph value (so the mark tells sealed from plain exactly,
    whatever the bytes: LangGraph's raw ``bytes`` values can begin with anything), and
    at most 64 characters, 63 when it is to be ``sealed`` (the mark takes one).

    Raises:
        SerializationError: The type begins with ``!``, or is too long.
    """
    if kind[:1] == MARK:
        raise SerializationError(
            f"a serializer type may not begin with {MARK!r} (it marks encrypted values): {kind!r}"
        )
    top = MAX_TYPE - 1 if sealed else MAX_TYPE
    if len(kind) > top:
        why = " when encrypted (the mark of a sealed value takes one)" if sealed else ""
        raise SerializationError(
            f"a serializer type may be at most {top} characters{why}, not {len(kind)}: "
            f"{kind[:20]!r}..."
        )
    return kind
