"""Cold start: ``import tenxstore`` pays for the package, not for what a program may
use later (issue "Cold start"), and the schema check at first use knows the newest
revision without Alembic. The processes that open a store are in
``tests/contract/test_cold_start.py``."""

from __future__ import annotations

from tenxstore import migrate
from tests.procs import loaded_packages

# What any program must not load unless it asked for it: each is the price of a
# feature it has not used (the contract suite's processes that write check it too).
UNASKED = (
    "alembic",
    "redis",
    "langgraph",
    "langchain_core",
    "typer",
    "rich",
    "cryptography",
    "numpy",
    "opentelemetry",
)
# What ``import tenxstore`` alone must not load: no database either.
NEVER_AT_IMPORT = (*UNASKED, "sqlalchemy", "asyncpg", "aiosqlite", "asyncmy")


def test_import_tenxstore_loads_no_database_driver_cache_or_framework() -> None:
    assert loaded_packages("import tenxstore", NEVER_AT_IMPORT) == []


def test_the_check_sees_what_it_looks_for() -> None:
    """The probe reports a package the code did load (a check that finds nothing
    proves nothing)."""
    assert loaded_packages("import tenxstore, sqlalchemy, json", ("sqlalchemy", "json")) == [
        "json",
        "sqlalchemy",
    ]


def test_every_public_name_still_imports_from_the_package() -> None:
    import tenxstore

    namespace: dict[str, object] = {}
    exec("from tenxstore import *", namespace)  # the star import itself
    for name in tenxstore.__all__:
        assert namespace[name] is getattr(tenxstore, name), name
        assert name in dir(tenxstore)
    assert isinstance(tenxstore.__version__, str)


def test_head_is_the_newest_migration_script() -> None:
    """The first call compares the schema with migrate.HEAD, without Alembic: it must
    be the scripts' head (a new migration moves both)."""
    assert migrate._scripts().get_current_head() == migrate.HEAD


def test_a_submodule_is_an_attribute_after_a_bare_import() -> None:
    """``tenxstore.telemetry.configure(...)`` at startup, as the docs write it: a
    submodule is imported when first named, as the eager package made it an attribute."""
    code = (
        "import tenxstore\n"
        "tenxstore.telemetry.configure(record_ids=False)\n"
        "assert tenxstore.migrate.HEAD and tenxstore.backends.open_backend\n"
        "assert tenxstore.langgraph.__name__ == 'tenxstore.langgraph'\n"
        "assert not hasattr(tenxstore, 'cli') and not hasattr(tenxstore, 'no_such_room')"
    )
    assert loaded_packages(code, ("typer",)) == []  # the console script is not an attribute


def test_public_annotations_still_resolve() -> None:
    """Tools that evaluate hints (pydantic, sphinx) see every name the API names."""
    import typing

    import tenxstore

    for cls in (tenxstore.Checkpointer, tenxstore.CheckpointRepository):
        typing.get_type_hints(cls.astats)
