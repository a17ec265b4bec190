"""The house's rules that a reader relies on, checked on the source (docs/architecture.md).

No module outside ``tenxstore/backends/`` asks which database it is on, names a
backend class or imports a driver: a difference between databases is a backend's
method or capability flag. The few places that must name one are listed here, each
with its reason; a new one fails this test until it moves into a backend or is
argued for here.
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).parents[2] / "tenxstore"

DIALECT = re.compile(
    r"dialect\s*[!=]=|dialect\.name|"
    r"^\s*(?:import|from)\s+(?:asyncpg|aiosqlite|asyncmy|pymysql|sqlite3|psycopg)\b|"
    r"from\s+sqlalchemy\.dialects|"
    r"\b(?:PostgresBackend|PgBouncerBackend|SqliteBackend|MemoryBackend|MysqlBackend)\b",
    re.MULTILINE,
)

ALLOWED = {
    # the declarative tables: MySQL's column variants (with_variant), as SQLAlchemy's
    # own documentation writes them
    "models.py": 1,
    # Alembic runs without a backend: which advice a refused setup gives
    "migrate.py": 2,
}


def named_outside_backends() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("backends/"):
            continue
        hits = [m.group(0).strip() for m in DIALECT.finditer(path.read_text(encoding="utf-8"))]
        if hits:
            found[relative] = hits
    return found


def test_no_module_outside_the_backends_names_a_database() -> None:
    found = named_outside_backends()
    unexpected = {
        module: hits for module, hits in found.items() if len(hits) > ALLOWED.get(module, 0)
    }
    assert unexpected == {}, (
        "a database named outside tenxstore/backends/ (make it a backend method or "
        f"capability flag): {unexpected}"
    )


def test_the_check_sees_what_it_looks_for() -> None:
    """The pattern catches each kind of naming (a check that finds nothing proves
    nothing)."""
    for line in (
        'if store.backend.dialect == "postgresql":',
        "pg = conn.dialect.name",
        "import asyncpg",
        "from sqlalchemy.dialects.postgresql import JSONB",
        "assert isinstance(backend, SqliteBackend)",
    ):
        assert DIALECT.search(line), line
    assert not DIALECT.search("backend.lateral_lookups")
