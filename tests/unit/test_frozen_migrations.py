"""The migrations are history: what a revision emits must not change with the library.

Each revision in ``alembic/versions/`` takes its column types and table options from
``alembic/frozen_ddl.py``, never from ``tenxstore`` (an edit of the library would
rewrite what an old revision creates). The one import of the library a revision may
make is ``tenxstore.errors``: the errors a refused migration raises.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from alembic.util import load_python_file
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Dialect

ALEMBIC = Path(__file__).parents[2] / "alembic"
REVISIONS = sorted((ALEMBIC / "versions").glob("*.py"))
ALLOWED = {"tenxstore.errors"}


def library_imports(source: str) -> list[str]:
    """The modules of tenxstore that ``source`` imports (anywhere in it: a function's
    own import too), by name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "tenxstore":  # from tenxstore import errors
                names = [f"tenxstore.{alias.name}" for alias in node.names]
            else:
                names = [node.module]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names = [str(node.args[0].value)]
        else:
            continue
        found += [n for n in names if n == "tenxstore" or n.startswith("tenxstore.")]
    return found


def test_there_are_revisions_to_check() -> None:
    assert len(REVISIONS) >= 11


@pytest.mark.parametrize("path", REVISIONS, ids=lambda p: p.name)
def test_a_revision_imports_nothing_of_the_library_but_its_errors(path: Path) -> None:
    imported = library_imports(path.read_text(encoding="utf-8"))
    assert set(imported) <= ALLOWED, (
        f"{path.name} imports {sorted(set(imported) - ALLOWED)}: take the helper from "
        "alembic/frozen_ddl.py (add a new function there; never change one)"
    )


def test_the_frozen_helpers_import_nothing_of_the_library() -> None:
    assert library_imports((ALEMBIC / "frozen_ddl.py").read_text(encoding="utf-8")) == []


def test_the_check_sees_what_it_looks_for() -> None:
    """Each way of importing the library is caught (a check that finds nothing proves
    nothing), and what is allowed is told apart."""
    for source in (
        "from tenxstore.backends.mysql import long_text",
        "import tenxstore.backends.mysql",
        "import tenxstore",
        "from tenxstore import models",
        "def upgrade():\n    from tenxstore.models import Base",
        "importlib.import_module('tenxstore.models')",
    ):
        assert set(library_imports(source)) - ALLOWED, source
    for source in (
        "from tenxstore.errors import ConfigError",
        "from tenxstore import errors",
        "from alembic import op",
        "import tenxstore_other",
    ):
        assert set(library_imports(source)) <= ALLOWED, source


def test_every_revision_loads_from_its_own_directory() -> None:
    """The revisions find the frozen helpers by their own path (no sys.path entry): the
    same in a checkout and in the wheel's ``tenxstore/_alembic``."""
    scripts = ScriptDirectory(str(ALEMBIC))
    revisions = list(scripts.walk_revisions())
    assert len(revisions) == len(REVISIONS)


_DIALECTS: dict[str, Dialect] = {
    "postgresql": postgresql.dialect(),
    "sqlite": sqlite.dialect(),
    "mysql": mysql.dialect(),
}
#: What each frozen helper compiles to, by database: the DDL the revisions emitted
#: when they were written.
_FROZEN = [
    ("long_text", (), ("TEXT", "TEXT", "LONGTEXT")),
    ("long_blob", (), ("BYTEA", "BLOB", "LONGBLOB")),
    ("timestamp", (), ("TIMESTAMP WITH TIME ZONE", "DATETIME", "DATETIME(6)")),
    ("key_string", (255, 191), ("VARCHAR(255)", "VARCHAR(255)", "VARCHAR(191)")),
]


@pytest.mark.parametrize(("helper", "args", "ddl"), _FROZEN, ids=[f[0] for f in _FROZEN])
def test_the_frozen_types_compile_as_they_did(
    helper: str, args: tuple[int, ...], ddl: tuple[str, ...]
) -> None:
    made = getattr(load_python_file(str(ALEMBIC), "frozen_ddl.py"), helper)(*args)
    assert tuple(made.compile(dialect=d) for d in _DIALECTS.values()) == ddl


def test_the_frozen_table_options_are_as_they_were() -> None:
    frozen = load_python_file(str(ALEMBIC), "frozen_ddl.py")
    assert frozen.table_options(_DIALECTS["postgresql"]) == {}
    assert frozen.table_options(_DIALECTS["sqlite"]) == {}

    class Bind:
        dialect = _DIALECTS["mysql"]

    options = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4"}
    assert frozen.table_options(Bind()) == {**options, "mysql_collate": "utf8mb4_0900_bin"}
    Bind.dialect = mysql.dialect(is_mariadb=True)
    assert frozen.table_options(Bind()) == {**options, "mysql_collate": "utf8mb4_nopad_bin"}
