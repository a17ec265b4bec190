"""What a one-step write whose link broke did, from what the look saw
(``tenxstore/backends/lost_writes.py``): every row of the decision, on the judgement
itself (the databases' fault tests reach it through broken links)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tenxstore import ConnectionLost
from tenxstore.backends.lost_writes import after_a_lost_write, new_write_id
from tenxstore.backends.records import Head, HeadWrite
from tenxstore.backends.sqlite import SqliteBackend


def write(expected: int = 5, incarnation: int | None = 1, limit: int = 3) -> HeadWrite:
    return HeadWrite(
        "t", "u", True, expected, incarnation, "{}", None, datetime.now(timezone.utc), [], limit
    )


@pytest.fixture
def failures() -> SqliteBackend:
    """A backend as the judge's ``failures`` (its name, its logged ConnectionLost)."""
    return SqliteBackend.__new__(SqliteBackend)


def test_its_own_row_there_is_a_commit(failures: SqliteBackend) -> None:
    # later writes may have followed it: the head it made is the version after expected
    assert after_a_lost_write(failures, write(), (9, 1, "u", True)) == Head(6, 1, "u", None)


def test_nothing_moved_is_nothing_written(failures: SqliteBackend) -> None:
    with pytest.raises(ConnectionLost) as err:
        after_a_lost_write(failures, write(), (5, 1, "u", False))
    assert err.value.committed is False


@pytest.mark.parametrize(
    "seen",
    [
        None,  # the thread is gone
        (6, 1, "u", False),  # another writer took the next version
        (5, 2, "u", False),  # the thread was replaced (another life at the same version)
        (8, 1, "u", False),  # moved on, but its own row would still be kept (8 - 3 < 6)
    ],
)
def test_another_writer_first_is_left_to_the_locked_path(
    failures: SqliteBackend, seen: tuple[int, int, str, bool] | None
) -> None:
    assert after_a_lost_write(failures, write(), seen) is None


def test_a_row_that_may_have_been_pruned_since_is_unknown(failures: SqliteBackend) -> None:
    # 9 - 3 >= 6: had it committed, its version-6 row would be pruned by now
    with pytest.raises(ConnectionLost) as err:
        after_a_lost_write(failures, write(), (9, 1, "u", False))
    assert err.value.committed is None


def test_write_ids_are_positive_63_bit_and_differ() -> None:
    ids = {new_write_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(0 <= i < 2**63 for i in ids)
