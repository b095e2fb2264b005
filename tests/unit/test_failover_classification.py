"""What a database failover looks like to the service: every error of it is transient.

A failover or switchover shows the worker and the relay a standby that answers read-only
(25006), a server shutting down or starting (57P01, 57P02, 57P03), connections lost (class 08)
or refused, and, with a multi-host URL, no primary among the hosts for a moment. The errors are
built as asyncpg and SQLAlchemy raise them; ``tests/failover`` meets them on real servers.
"""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url

from fulfilment.adapters.postgres.engine import _drop_connections_to_a_standby, asyncpg_dsn
from fulfilment.adapters.postgres.retry import is_transient, retry_label
from fulfilment.relay.service import RECONNECT_ERRORS

FAILOVER_ERRORS = [
    asyncpg.exceptions.ReadOnlySQLTransactionError(
        "cannot execute INSERT in a read-only transaction"
    ),
    asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"),
    asyncpg.exceptions.CrashShutdownError("terminating connection due to crash of another server"),
    asyncpg.exceptions.CannotConnectNowError("the database system is in recovery mode"),
    asyncpg.exceptions.CannotConnectNowError("the database system is shutting down"),
    asyncpg.exceptions.ConnectionFailureError("connection failure"),
    asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle"),
]


def wrapped(error: Exception) -> sa_exc.DBAPIError:
    """The error as SQLAlchemy's asyncpg dialect raises it (``DBAPIError`` over the driver's)."""
    return sa_exc.DBAPIError("SELECT place_orders()", {}, error)


@pytest.mark.parametrize("error", FAILOVER_ERRORS, ids=lambda error: type(error).__name__)
def test_every_error_of_a_failover_is_transient_bare_and_wrapped(error):
    assert is_transient(error)
    assert is_transient(wrapped(error))


def test_a_read_only_standby_is_counted_under_its_own_label():
    error = asyncpg.exceptions.ReadOnlySQLTransactionError("read-only transaction")
    assert retry_label(error) == "read_only"
    assert retry_label(wrapped(error)) == "read_only"


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError(111, "Connection refused"),
        asyncpg.exceptions.TargetServerAttributeNotMatched(
            "None of the hosts match the target attribute requirement read-write"
        ),
    ],
    ids=["refused", "no primary among the hosts"],
)
def test_no_primary_to_connect_to_is_transient(error):
    assert is_transient(error)


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.exceptions.ReadOnlySQLTransactionError("read-only transaction"),
        asyncpg.exceptions.TargetServerAttributeNotMatched("no read-write host"),
        asyncpg.InternalClientError("cannot switch to state 12; another operation is in progress"),
        asyncpg.exceptions.CannotConnectNowError("the database system is in recovery mode"),
        asyncpg.exceptions.AdminShutdownError("terminating connection"),
        ConnectionRefusedError(111, "Connection refused"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_the_relay_connects_again_after_every_error_of_a_failover(error):
    assert isinstance(error, RECONNECT_ERRORS)


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.exceptions.CheckViolationError("stock_levels_reserved_check"),
        asyncpg.exceptions.InsufficientPrivilegeError("permission denied"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_bug_or_a_refusal_is_not_taken_for_a_failover(error):
    assert not is_transient(error)
    assert not is_transient(wrapped(error))


class Context:
    """The parts of SQLAlchemy's ``ExceptionContext`` the hook reads and sets."""

    def __init__(self, error: Exception) -> None:
        self.original_exception = error
        self.is_disconnect = False


def test_the_engine_drops_a_connection_that_met_a_standby():
    context = Context(asyncpg.exceptions.ReadOnlySQLTransactionError("read-only transaction"))
    _drop_connections_to_a_standby(context)  # type: ignore[arg-type]
    assert context.is_disconnect


def test_the_engine_keeps_a_connection_that_met_a_lock_timeout():
    context = Context(asyncpg.exceptions.LockNotAvailableError("lock timeout"))
    _drop_connections_to_a_standby(context)  # type: ignore[arg-type]
    assert not context.is_disconnect


def test_repeated_hosts_become_the_one_list_asyncpg_reads():
    dsn = asyncpg_dsn(
        "postgresql+asyncpg://fulfilment:secret@/fulfilment"
        "?host=db-a:5432&host=db-b:5433&target_session_attrs=read-write&sslmode=require"
    )
    query = make_url(dsn).query
    assert make_url(dsn).drivername == "postgresql"
    assert query["host"] == "db-a:5432,db-b:5433"
    assert query["target_session_attrs"] == "read-write"
    assert query["sslmode"] == "require"
    assert make_url(dsn).password == "secret"  # noqa: S105 - the URL's own, kept in the DSN


def test_one_host_in_the_query_is_left_as_it_is():
    dsn = asyncpg_dsn("postgresql+asyncpg://u@/db?host=db-rw:5432")
    assert make_url(dsn).query["host"] == "db-rw:5432"
