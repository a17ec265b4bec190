"""The house's rules that a reader relies on, checked on the source (docs/architecture.md).

Every module is read in one sitting (at most MODULE_LINES lines), every function
without scrolling (at most FUNCTION_LINES, or its docstring says why), and the
package's modules import each other without a cycle.

No module outside ``tenxstore/backends/`` asks which database it is on, names a
backend class or imports a driver: a difference between databases is a backend's
method or capability flag. The few places that must name one are listed here, each
with its reason; a new one fails this test until it moves into a backend or is
argued for here.
"""

from __future__ import annotations

import ast
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


# -- sizes: a module a reader holds in one sitting, a function read without scrolling --

MODULE_LINES = 600
FUNCTION_LINES = 60
REASON = "Long because"


def _modules() -> list[tuple[str, str]]:
    return [
        (path.relative_to(PACKAGE).as_posix(), path.read_text(encoding="utf-8"))
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


def long_functions(source: str) -> list[tuple[str, int]]:
    """Functions in ``source`` longer than FUNCTION_LINES whose docstring does not say
    why (a paragraph beginning "Long because")."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > FUNCTION_LINES and REASON not in (ast.get_docstring(node) or ""):
                found.append((node.name, length))
    return found


def test_every_module_is_read_in_one_sitting() -> None:
    too_long = {
        name: lines for name, source in _modules() if (lines := source.count("\n")) > MODULE_LINES
    }
    assert too_long == {}, f"modules over {MODULE_LINES} lines (split by subject): {too_long}"


def test_every_long_function_says_why() -> None:
    found = {name: hits for name, source in _modules() if (hits := long_functions(source))}
    assert found == {}, (
        f"functions over {FUNCTION_LINES} lines without a '{REASON}' paragraph in their "
        f"docstring (break them into named steps, or say why not): {found}"
    )


def test_the_length_check_sees_what_it_looks_for() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    assert long_functions(f"def f():\n{body}\n") == [("f", FUNCTION_LINES + 1)]
    argued = f'def f():\n    """Long because a table."""\n{body}\n'
    assert long_functions(argued) == []


# -- imports: the package's modules form no cycle (a reader can start at the bottom) --


def _module_name(relative: str) -> str:
    parts = ["tenxstore", *relative.removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(relative: str, source: str, known: set[str]) -> set[str]:
    """The package modules ``source`` imports at module level (imports inside functions
    and under ``TYPE_CHECKING`` do not run at import time, so they cannot close a
    cycle)."""
    me = _module_name(relative)
    package = me if relative.endswith("__init__.py") else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name in known and name != me}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_import_cycle() -> None:
    modules = _modules()
    known = {_module_name(relative) for relative, _ in modules}
    graph = {
        _module_name(relative): _imports(relative, source, known) - {"tenxstore"}
        for relative, source in modules
    }
    assert import_cycles(graph) == []


def test_the_cycle_check_sees_what_it_looks_for() -> None:
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


# -- private names stay in their module --


def private_imports(source: str) -> list[str]:
    """Private names (one leading underscore) ``source`` imports from tenxstore's own
    modules: a name another module needs is public there."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (
            node.level or (node.module or "").startswith("tenxstore")
        ):
            found += [
                f"{node.module}.{alias.name}"
                for alias in node.names
                if alias.name.startswith("_") and not alias.name.startswith("__")
            ]
    return found


def test_no_private_name_is_imported_from_another_module() -> None:
    found = {name: hits for name, source in _modules() if (hits := private_imports(source))}
    assert found == {}, f"private names imported across modules (make them public): {found}"


def test_the_private_import_check_sees_what_it_looks_for() -> None:
    assert private_imports("from .crypto import _OLD_HEAD, KeyRing") == ["crypto._OLD_HEAD"]
    assert private_imports("from tenxstore.rotation import _TABLES") == [
        "tenxstore.rotation._TABLES"
    ]
    assert private_imports("from os import _exit\nfrom .x import __all__") == []


def test_every_module_is_in_the_architecture_tables() -> None:
    """docs/architecture.md has a row for each module, so a new one is placed in the
    house (a module that went is taken out of it)."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `([\w/]+\.py)` \| \d+ \|", text, re.MULTILINE))
    assert rows == {name for name, _ in _modules()}
