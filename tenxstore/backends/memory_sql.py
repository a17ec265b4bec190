"""Each database's full-text engine over the memories' keyword index (``memories.terms``).

The words of a memory are found by :mod:`tenxstore.memory.search` (one tokenizer for
every database: NFKC, case folded, runs of letters, digits and marks), and stored as
``terms``: the words in order, one space apart, as this module writes them for its
engine. A query is the same tokenizer's words; each engine is asked for the memories
holding any of them (``OR``), with its own rank, and whether they hold the words as
one phrase:

=============  ============================================================  ==========
database       match, and rank                                               phrase
=============  ============================================================  ==========
SQLite         FTS5 ``memories_fts MATCH '"a" OR "b"'``, ``-bm25()``           ``"a b"``
PostgreSQL     ``to_tsvector('simple', terms) @@ to_tsquery('a | b')``,       ``<->``
               ``ts_rank`` (no stemming, no stopwords)
MySQL/MariaDB  InnoDB ``MATCH (terms) AGAINST (... IN BOOLEAN MODE)``,        ``"a b"``
               ranked by the natural-language relevance
=============  ============================================================  ==========

InnoDB leaves out words shorter than ``innodb_ft_min_token_size`` (3 by default, at
most 16: a server setting) and its stopwords ("about", "the", ...): on MySQL every
word is written padded with ``_`` to 16 characters (``qx`` is ``qx______________``),
which InnoDB reads as one word of 16 characters — no word is too short, none is a
stopword — and the tokenizer never yields a ``_`` of its own, so no two words meet.
Ranks are normalised per query by the caller (:mod:`tenxstore.memory.search`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Boolean, Float, Table, case, column, func, literal, literal_column, select
from sqlalchemy import table as table_clause
from sqlalchemy.dialects.mysql import match
from sqlalchemy.sql import Select

__all__ = ["KeywordSearch", "MysqlKeywords", "PostgresKeywords", "SqliteKeywords"]

MYSQL_WORD = 16
"""Characters every word takes on MySQL: ``innodb_ft_min_token_size``'s largest value."""


class KeywordSearch:
    """How one database finds memories by their words (see the module)."""

    def terms(self, words: Sequence[str]) -> str:
        """What ``memories.terms`` holds for a memory of these words."""
        return " ".join(words)

    def candidates(self, memories: Table, words: Sequence[str]) -> Select[Any]:
        """``SELECT memories.id, rel, phrase`` of the memories holding any of ``words``
        (``rel``: the engine's rank, larger is closer, at least 0; ``phrase``: 1 when
        they hold them as one phrase, else 0); the caller adds its own ``WHERE``."""
        raise NotImplementedError


class SqliteKeywords(KeywordSearch):
    """FTS5 (the table ``memories_fts``, made and kept by migration 0010's triggers)."""

    def candidates(self, memories: Table, words: Sequence[str]) -> Select[Any]:
        fts = table_clause("memories_fts", column("rowid"))
        name: Any = literal_column("memories_fts")
        # Every word quoted: FTS5 reads AND, OR, NOT, NEAR and * as operators otherwise.
        anyword = " OR ".join(f'"{w}"' for w in words)
        phrase: Any = literal(0)
        if len(words) > 1:
            within = (
                select(fts.c.rowid)
                .where(name.op("MATCH")(literal('"' + " ".join(words) + '"')))
                .correlate(None)  # its own memories_fts: the name MATCH refers to
            )
            phrase = case((memories.c.id.in_(within), 1), else_=0)
        # The match alone first, as a subquery SQLite may not flatten into the join (it
        # has a LIMIT): flattened, the planner walked the user's memories by index and
        # ran the whole MATCH once per memory (5.8 s for three words over 3,000 memories,
        # against 0.1 s this way).
        hits = (
            select(fts.c.rowid.label("id"), (-func.bm25(name)).label("rel"))
            .where(name.op("MATCH")(literal(anyword)))
            .limit(-1)
            .subquery("hits")
        )
        return select(memories.c.id, hits.c.rel, phrase.label("phrase")).select_from(
            hits.join(memories, memories.c.id == hits.c.id)
        )


class PostgresKeywords(KeywordSearch):
    """``tsvector`` of the ``simple`` configuration (migration 0010's GIN index is on
    exactly this expression)."""

    def candidates(self, memories: Table, words: Sequence[str]) -> Select[Any]:
        simple: Any = literal_column("'simple'")
        vector = func.to_tsvector(simple, memories.c.terms)
        # The words hold only letters, digits and marks: nothing tsquery reads as syntax.
        anyword = func.to_tsquery(simple, literal(" | ".join(words)))
        phrase: Any = literal(0)
        if len(words) > 1:
            together = func.phraseto_tsquery(simple, literal(" ".join(words)))
            phrase = case((vector.op("@@", return_type=Boolean)(together), 1), else_=0)
        return select(
            memories.c.id,
            func.ts_rank(vector, anyword, type_=Float).label("rel"),
            phrase.label("phrase"),
        ).where(vector.op("@@", return_type=Boolean)(anyword))


def _padded(word: str) -> str:
    return word + "_" * (MYSQL_WORD - len(word))


class MysqlKeywords(KeywordSearch):
    """InnoDB FULLTEXT, every word padded (see the module)."""

    def terms(self, words: Sequence[str]) -> str:
        return " ".join(map(_padded, words))

    def candidates(self, memories: Table, words: Sequence[str]) -> Select[Any]:
        text = self.terms(words)  # no operator in it: letters, digits, marks and _
        found = match(memories.c.terms, against=literal(text)).in_boolean_mode()
        ranked = match(memories.c.terms, against=literal(text)).in_natural_language_mode()
        phrase: Any = literal(0)
        if len(words) > 1:
            together = match(memories.c.terms, against=literal(f'"{text}"')).in_boolean_mode()
            phrase = case((together > 0, 1), else_=0)
        return select(memories.c.id, ranked.label("rel"), phrase.label("phrase")).where(found)
