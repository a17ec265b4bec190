"""The unit layer: no database, no Redis, seconds. Every test here is marked ``unit``
(``pytest -m unit``)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/unit/" in item.nodeid:
            item.add_marker(pytest.mark.unit)
