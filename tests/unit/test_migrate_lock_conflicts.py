"""``fulfilment migrate`` tries an upgrade again only when it lost a lock to the services."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import DBAPIError

from fulfilment.tools.migrate import lost_a_lock


class _DriverError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


def _wrapped(sqlstate: str, *, on_cause: bool = False) -> DBAPIError:
    if on_cause:
        adapted = Exception("adapted")
        adapted.__cause__ = _DriverError(sqlstate)
        return DBAPIError("ALTER TABLE stock_levels ...", {}, adapted)
    return DBAPIError("ALTER TABLE stock_levels ...", {}, _DriverError(sqlstate))


@pytest.mark.parametrize("sqlstate", ["40P01", "55P03"])
@pytest.mark.parametrize("on_cause", [False, True])
def test_a_deadlock_or_a_lock_timeout_is_tried_again(sqlstate: str, *, on_cause: bool) -> None:
    assert lost_a_lock(_wrapped(sqlstate, on_cause=on_cause))


@pytest.mark.parametrize("sqlstate", ["42P01", "23514", "28P01"])
def test_any_other_database_error_is_not(sqlstate: str) -> None:
    assert not lost_a_lock(_wrapped(sqlstate))


def test_an_error_that_is_not_the_database_s_is_not() -> None:
    assert not lost_a_lock(TimeoutError("40P01"))
