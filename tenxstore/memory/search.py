"""Keyword search: the words of a text, and the ranked statement every database runs.

One tokenizer for every database, so a query finds the same memories wherever they
are stored: the text in Unicode NFKC, case folded, cut into runs of letters, digits
and combining marks (everything else separates words: spaces, punctuation, symbols,
``_``). ``QX-7731`` is the two words ``qx`` and ``7731``, found as a phrase. A word
is at most :data:`MAX_WORD` characters (longer ones are cut), and a memory's first
words up to :data:`MAX_INDEXED_BYTES` are indexed. Words are not stemmed
and no word is a stopword. Scripts written without spaces (Chinese, Japanese, Thai)
are not cut into words: a run of them is one word.

The database's engine matches and ranks (:mod:`tenxstore.backends.memory_sql`); the
statement here scopes the candidates to the caller (user, namespace, not expired)
and turns the engine's rank into a score in [0, 1] within the query: the best match
has 1, every other its rank over the best one's. When the query has two words or
more and some memories hold them as a phrase, those come first: their scores are in
[0.5, 1] (the best 1), the others' in [0, 0.5] (each group's rank over its best).
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Float, Table, case, cast, func, select
from sqlalchemy.sql import Select

from ..backends.memory_sql import KeywordSearch

__all__ = [
    "MAX_INDEXED_BYTES",
    "MAX_QUERY_WORDS",
    "MAX_WORD",
    "indexed_words",
    "query_words",
    "ranked",
    "words",
]

MAX_WORD = 64
"""Characters a word keeps (a longer run is cut to this)."""
MAX_QUERY_WORDS = 64
"""Words of a query that are searched for (the first ones)."""
MAX_INDEXED_BYTES = 256 * 1024
"""UTF-8 bytes of a memory's words that the keyword index holds: its first words up to
this (PostgreSQL's ``tsvector`` holds at most 1 MB with its positions, and MySQL's
padded words take up to 16 bytes each, under its ``max_allowed_packet``)."""
_SCANNED = 0x20000  # the planes that hold combining marks outside a few rare scripts


@functools.cache
def _word() -> re.Pattern[str]:
    """Letters and digits (``[^\\W_]``) and combining marks (categories M*, listed from
    the Unicode database once per process)."""
    ranges: list[str] = []
    start = None
    for cp in range(min(_SCANNED, sys.maxunicode + 1)):
        mark = unicodedata.category(chr(cp))[0] == "M"
        if mark and start is None:
            start = cp
        elif not mark and start is not None:
            ranges.append(f"\\U{start:08x}-\\U{cp - 1:08x}")
            start = None
    return re.compile(f"(?:[^\\W_]|[{''.join(ranges)}])+")


def words(text: str) -> list[str]:
    """The words of ``text``, in order (see the module)."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return [w[:MAX_WORD] for w in _word().findall(folded)]


def indexed_words(text: str) -> list[str]:
    """The words of a memory the keyword index holds: the first ones, up to
    :data:`MAX_INDEXED_BYTES` (with a space between words)."""
    found = words(text)
    budget = MAX_INDEXED_BYTES
    for i, word in enumerate(found):
        budget -= len(word.encode("utf-8")) + 1
        if budget < 0:
            return found[:i]
    return found


def query_words(query: str) -> list[str]:
    """The words a query searches for: its first :data:`MAX_QUERY_WORDS`."""
    return words(query)[:MAX_QUERY_WORDS]


def ranked(
    engine: KeywordSearch,
    memories: Table,
    found: Sequence[str],
    scope: Sequence[ColumnElement[bool]],
) -> Select[Any]:
    """``SELECT memories.*, score`` of the memories in ``scope`` holding any of the
    words ``found``, best first (then the most recently written)."""
    candidates = engine.candidates(memories, found).where(*scope).subquery("candidates")
    rel = cast(candidates.c.rel, Float)
    # the rank over the best one's, among the memories holding the phrase and among the
    # others apart; phrase holders first: (closeness + 1) / 2 >= 0.5 >= closeness / 2
    best = func.max(rel).over(partition_by=candidates.c.phrase)
    closeness = case((best > 0, rel / best), else_=1.0)
    if len(found) > 1:
        phrase = cast(candidates.c.phrase, Float)
        score: Any = (closeness + phrase) / (func.max(phrase).over() + 1.0)
    else:
        score = closeness
    scored = select(candidates.c.id, score.label("score")).subquery("scored")
    return (
        select(*memories.c, scored.c.score)
        .select_from(scored.join(memories, memories.c.id == scored.c.id))
        .order_by(scored.c.score.desc(), memories.c.updated_at.desc(), memories.c.id.desc())
    )
