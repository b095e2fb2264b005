"""The one retry policy of the PostgreSQL adapter: which errors are transient, and for how long.

A transient error is retried by one layer (docs/events.md, "Outcomes and failures"): this one. The
errors it retries are named in :func:`is_transient`; anything else, such as a CHECK violation
(a bug) or a cancellation, propagates on the first attempt, unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import TypeVar

import asyncpg
import structlog
from sqlalchemy import exc as sa_exc
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_before_delay,
    wait_random_exponential,
)

from fulfilment.application.ports import TransientError

T = TypeVar("T")

RetryHook = Callable[[BaseException], None]
"""Called with the error each time an attempt failed and another one follows (e.g. a metric)."""

CONNECTION = "connection"
"""The label of a retry after a connection failed: SQLSTATE class 08, or no SQLSTATE at all."""
POOL_TIMEOUT = "pool_timeout"
"""The label of a retry after no pooled connection became free in time."""
OTHER = "other"
"""The label of a retried error whose SQLSTATE the tables below do not name."""

TRANSIENT_SQLSTATES: Mapping[str, str] = MappingProxyType(
    {
        "40001": "serialization_failure",
        "40P01": "deadlock",  # deadlock_detected
        "55P03": "lock_timeout",  # lock_not_available: lock_timeout expired
        "57014": "statement_timeout",  # query_canceled: statement_timeout expired
        "57P01": "server_shutdown",  # admin_shutdown: the server is restarting or failing over
        "57P02": "server_shutdown",  # crash_shutdown
        "57P03": "server_starting",  # cannot_connect_now: the server is starting up
        "53300": "too_many_connections",
        # read_only_sql_transaction: the server is, or has just become, a standby (a failover
        # or switchover); the connection is dropped (``engine``) and the next one finds the
        # primary.
        "25006": "read_only",
    }
)
"""SQLSTATEs worth another attempt, besides the whole class 08, each with the ``error`` label
that counts its retries (:func:`retry_label`)."""

TRANSIENT_SQLSTATE_CLASSES: Mapping[str, str] = MappingProxyType({"08": CONNECTION})
"""SQLSTATE classes (first two characters) worth another attempt, with their label: 08 is
connection_exception."""

RETRY_LABELS = (
    *sorted(set(TRANSIENT_SQLSTATES.values())),
    CONNECTION,
    POOL_TIMEOUT,
    OTHER,
)
"""Every label :func:`retry_label` returns: the closed list a metric can bind at 0. The values
are those of ``fulfilment_database_retries_total{error}``, which dashboards and alerts query."""

FIRST_BACKOFF_SECONDS = 0.05
"""Upper bound of the first random sleep; the bound doubles on each attempt."""

MAX_BACKOFF_SECONDS = 1.0
"""Upper bound of any one sleep between attempts."""

logger = structlog.get_logger(__name__)


def sqlstate_of(error: BaseException | None) -> str | None:
    """The PostgreSQL SQLSTATE of ``error`` (a SQLAlchemy ``DBAPIError``), else None."""
    source = error.orig if isinstance(error, sa_exc.DBAPIError) else error
    code = getattr(source, "sqlstate", None)
    return code if isinstance(code, str) else None


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` may go away if the same statement is tried again.

    Transient are, and nothing else:

    - a connection SQLAlchemy invalidated (``DBAPIError.connection_invalidated``);
    - SQLSTATE class 08 and the codes in :data:`TRANSIENT_SQLSTATES`, carried by SQLAlchemy's
      ``DBAPIError`` (its dialect wraps every ``asyncpg.PostgresError``, connecting included)
      or by an ``asyncpg.PostgresError`` itself (the reservations' asyncpg pool);
    - asyncpg's ``InterfaceError`` "connection is closed" (the test SQLAlchemy's dialect makes
      for a disconnect, too): a connection of the asyncpg pool died between two statements;
    - asyncpg's ``InternalClientError``, bare or wrapped by SQLAlchemy: the client protocol
      out of step with its connection, which a server that terminates the connection just as
      a statement starts causes (a failover); nothing was sent, and a retry opens a new one;
    - ``OSError`` raised while connecting (refused, reset, unreachable host, DNS failure, and
      asyncpg's connect ``timeout``, a ``TimeoutError``), which asyncpg does not wrap;
    - ``sqlalchemy.exc.TimeoutError``, or the asyncpg pool's ``TimeoutError``: no pooled
      connection became free in time.
    """
    driver = error.orig if isinstance(error, sa_exc.DBAPIError) else error
    if isinstance(driver, asyncpg.InternalClientError) or isinstance(
        getattr(driver, "__cause__", None), asyncpg.InternalClientError
    ):
        return True
    if isinstance(error, asyncpg.InterfaceError):
        return "connection is closed" in str(error)
    if isinstance(error, sa_exc.DBAPIError):
        if error.connection_invalidated:
            return True
    elif not isinstance(error, asyncpg.PostgresError):
        return isinstance(error, OSError | sa_exc.TimeoutError)
    code = sqlstate_of(error)
    return code is not None and (
        code in TRANSIENT_SQLSTATES or code[:2] in TRANSIENT_SQLSTATE_CLASSES
    )


def retry_label(error: BaseException) -> str:
    """The fixed label of a retried ``error``, one of :data:`RETRY_LABELS` (for the metrics).

    ``pool_timeout`` for SQLAlchemy's pool timeout; the label of the error's SQLSTATE in
    :data:`TRANSIENT_SQLSTATES` or of its class in :data:`TRANSIENT_SQLSTATE_CLASSES`;
    ``connection`` for an error without a SQLSTATE (a connection that failed before the server
    answered, or the asyncpg pool's timeout); ``other`` for any other SQLSTATE.
    """
    if isinstance(error, sa_exc.TimeoutError):
        return POOL_TIMEOUT
    code = sqlstate_of(error)
    if code is None:
        return CONNECTION
    return TRANSIENT_SQLSTATES.get(code) or TRANSIENT_SQLSTATE_CLASSES.get(code[:2], OTHER)


def _describe(error: BaseException | None) -> str:
    if isinstance(error, sa_exc.DBAPIError):
        # The driver's message only: str(DBAPIError) repeats the statement and its parameters,
        # which for a large order are thousands of SKUs.
        return f"{type(error.orig).__name__}: {error.orig}"
    return f"{type(error).__name__}: {error}"


def retry_policy(
    *,
    operation: str,
    budget_seconds: float,
    on_retry: RetryHook | None = None,
) -> AsyncRetrying:
    """A fresh policy for one call (tenacity keeps per-call state on the policy object).

    Args:
        operation: what is retried, for the logs (e.g. ``place_orders``).
        budget_seconds: total time for all attempts and sleeps, in seconds. No sleep is started
            that would end past it, so the last attempt starts within the budget and the call
            ends at most one attempt later (an attempt is bounded by the server's
            ``statement_timeout`` and the connect timeout).
        on_retry: called with the error before each sleep, e.g. to count retries.

    Each retry is logged (``database_retry``, warning) with the attempt number, the SQLSTATE
    and the sleep. Sleeps are "full jitter": uniform in ``[0, min(1 s, 0.05 s x 2^n)]``, so
    workers contending for the same hot rows spread out. The policy re-raises the last error
    when the budget is spent; :func:`call_with_retry` translates it to ``TransientError``.
    """

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        logger.warning(
            "database_retry",
            operation=operation,
            attempt=state.attempt_number,
            elapsed_seconds=round(state.seconds_since_start or 0.0, 3),
            sleep_seconds=round(state.upcoming_sleep, 3),
            sqlstate=sqlstate_of(error),
            error=_describe(error),
        )
        if on_retry is not None and error is not None:
            on_retry(error)

    return AsyncRetrying(
        retry=retry_if_exception(is_transient),
        # stop_before_delay rather than stop_after_delay: it also refuses a sleep that would
        # end past the budget, so the handler's deadline (> budget) is not overrun by a sleep.
        stop=stop_before_delay(budget_seconds),
        wait=wait_random_exponential(multiplier=FIRST_BACKOFF_SECONDS, max=MAX_BACKOFF_SECONDS),
        before_sleep=before_sleep,
        reraise=True,
    )


async def call_with_retry(
    attempt: Callable[[], Awaitable[T]],
    *,
    operation: str,
    budget_seconds: float,
    on_retry: RetryHook | None = None,
) -> T:
    """Await ``attempt()`` under :func:`retry_policy`, translating a spent budget.

    ``attempt`` must be safe to repeat: each call starts from scratch (a new connection
    checkout and transaction).

    Raises:
        TransientError: the last attempt failed with a transient error once the budget was
            spent; the error is chained as ``__cause__``.
        Exception: any non-transient error of the first attempt that raised it, unchanged.
    """
    started = time.monotonic()
    attempts = 0
    try:
        async for attempt_manager in retry_policy(
            operation=operation, budget_seconds=budget_seconds, on_retry=on_retry
        ):
            with attempt_manager:
                attempts += 1
                return await attempt()
    except Exception as error:
        if not is_transient(error):
            raise
        elapsed = time.monotonic() - started
        msg = (
            f"{operation} failed after {attempts} attempt(s) in {elapsed:.2f} s "
            f"(budget {budget_seconds:g} s): {_describe(error)}"
        )
        raise TransientError(msg) from error
    # The policy either returns from inside the loop or raises; tenacity's types cannot say so.
    raise AssertionError  # pragma: no cover
