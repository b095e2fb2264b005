"""The database connections of one worker process: a SQLAlchemy engine, and an asyncpg pool.

The engine serves everything but the hot path (stock loads, reports, health, monitors,
redelivery counts). The reservations run on a plain asyncpg pool (:func:`create_pool`): one
``place_orders()`` call per batch of orders, without SQLAlchemy's execution machinery, which
cost the worker more CPU per delivery than asyncpg itself (docs/performance.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import asyncpg
from sqlalchemy import event
from sqlalchemy.engine import ExceptionContext, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

CLIENT_TIMEOUT_MARGIN_SECONDS = 1.0
"""How much longer than ``statement_timeout`` the pool waits for an answer before giving up
on the connection: the server cancels a slow statement first, and this bound only ends a
wait on a connection that stopped answering (a network partition, a failover)."""

ENGINE_POOL_SIZE = 2
"""Connections of the engine, at most: a health check and a monitor or a redelivery count."""

APPLICATION_NAME = "fulfilment"
"""``application_name`` of every session: ``pg_stat_activity`` shows whose connections they are."""


@dataclass(frozen=True, slots=True)
class DatabaseOptions:
    """Where PostgreSQL is and how long to wait for it: what the engine and the pool need.

    The roots build it from the settings (``FULFILMENT_DATABASE_*`` and
    ``FULFILMENT_RETRY_BUDGET_SECONDS``, which say what each value is for); times in seconds.
    """

    url: str = field(repr=False)
    """A ``postgresql+asyncpg://`` URL, credentials and libpq TLS parameters included (so kept
    out of ``repr``); see :func:`asyncpg_dsn`."""
    connect_timeout_seconds: float
    """Time allowed to open one connection."""
    statement_timeout_seconds: float
    """Server-side ``statement_timeout`` of every session."""
    lock_timeout_seconds: float
    """Server-side ``lock_timeout`` of every session."""
    retry_budget_seconds: float
    """Longest wait for a free connection of the engine."""
    pool_size: int
    """Connections of the reservations' pool, at most (:func:`create_pool`)."""


def asyncpg_dsn(url: str) -> str:
    """``url`` as asyncpg's ``connect`` and ``create_pool`` take it: scheme ``postgresql://``.

    Every connection of the service is opened from this one string, so that all of them read
    the URL's TLS parameters the same way. asyncpg parses libpq's own (``sslmode`` of disable,
    allow, prefer, require, verify-ca, verify-full; ``sslrootcert``, ``sslcert``, ``sslkey``,
    ``sslcrl``; ``PGSSLMODE`` and the other ``PGSSL*`` variables when the URL has none) with
    libpq's meanings (``asyncpg.connect_utils``). SQLAlchemy would instead pass each query
    parameter to ``asyncpg.connect`` as a keyword, which has no ``sslmode``: hence
    :func:`async_engine`.

    Several servers, of which the service uses whichever is primary, are named as SQLAlchemy
    documents it ("Specifying multiple fallback hosts"): one ``host`` query parameter each,
    ``?host=a:5432&host=b:5432&target_session_attrs=read-write``. asyncpg keeps only the last
    of a repeated parameter, so the hosts (and ``port``, if repeated) are joined into libpq's
    list, ``host=a:5432,b:5432``, which asyncpg tries in turn, keeping the first that is
    ``target_session_attrs`` (``read-write``: the primary).
    """
    parsed = make_url(url)
    query = {
        name: ",".join(value) if isinstance(value, tuple) and name in _LISTS else value
        for name, value in parsed.query.items()
    }
    return parsed.set(drivername="postgresql", query=query).render_as_string(hide_password=False)


_LISTS = frozenset({"host", "port"})
"""Query parameters that libpq (and asyncpg) take as one comma-separated list."""

READ_ONLY_SQL_TRANSACTION = "25006"
"""What a standby answers a write with: a connection that meets it is on a server that is no
longer (or not yet) the primary, and is dropped so the next one looks for the primary."""


def _drop_connections_to_a_standby(context: ExceptionContext) -> None:
    """``handle_error`` hook: take SQLSTATE 25006 for a disconnect.

    SQLAlchemy then invalidates the connection (and every pooled one opened before it), so a
    pool that was connected to the old primary, now a standby behind the same address, does
    not keep handing out read-only connections; the retry policy tries again on a new one.
    """
    if getattr(context.original_exception, "sqlstate", None) == READ_ONLY_SQL_TRANSACTION:
        context.is_disconnect = True


def async_engine(url: str, *, connect_args: dict[str, Any], **engine_args: Any) -> AsyncEngine:  # noqa: ANN401 - create_async_engine's own keywords
    """A SQLAlchemy engine whose connections asyncpg opens from :func:`asyncpg_dsn` of ``url``.

    ``connect_args`` go to ``asyncpg.connect`` (``timeout``, ``server_settings``);
    ``engine_args`` to ``create_async_engine`` (pool size and class). The engine's own URL
    keeps no query: SQLAlchemy's asyncpg dialect turns ``?sslmode=require`` into a keyword
    ``asyncpg.connect`` does not know (a ``TypeError``), so the connections come from
    ``async_creator`` instead. The engine connects on first use; the caller disposes of it.
    """
    dsn = asyncpg_dsn(url)

    async def connect() -> asyncpg.Connection:
        return await asyncpg.connect(dsn, **connect_args)

    engine = create_async_engine(
        make_url(url).set(drivername="postgresql+asyncpg", query={}),
        async_creator=connect,
        **engine_args,
    )
    event.listen(engine.sync_engine, "handle_error", _drop_connections_to_a_standby)
    return engine


def _milliseconds(seconds: float) -> str:
    return str(max(1, round(seconds * 1000)))


def create_engine(options: DatabaseOptions) -> AsyncEngine:
    """Build (but do not connect) the engine for ``options.url``.

    - At most :data:`ENGINE_POOL_SIZE` connections (no overflow); with the reservations' pool,
      a process holds at most ``pool_size`` + :data:`ENGINE_POOL_SIZE`. A task waits at most
      ``retry_budget_seconds`` for a free connection; the wait then fails with
      ``sqlalchemy.exc.TimeoutError``, which the retry policy treats as transient.
    - ``connect_timeout_seconds`` bounds opening one connection (asyncpg ``timeout``).
    - TLS as the URL's libpq parameters say (:func:`asyncpg_dsn`).
    - ``statement_timeout`` and ``lock_timeout`` are server settings of every session (from
      ``statement_timeout_seconds`` and ``lock_timeout_seconds``, sent in milliseconds): the
      server cancels a slow statement or lock wait, so a time-out never leaves a commit in
      doubt, and the error (57014, 55P03) is one the retry policy retries.
    - No ``pool_pre_ping``: on asyncpg it costs three round trips per checkout (``BEGIN``,
      ``;``, ``ROLLBACK``), three times the reservation's one. A connection dropped by a
      database failover fails its next statement instead; SQLAlchemy then invalidates every
      connection of the pool opened before the failure, and the retry policy
      (``adapters.postgres.retry``) tries again on a new one, within the same budget. A
      connection that meets a standby (SQLSTATE 25006) is dropped the same way
      (:func:`async_engine`).

    The caller owns the engine and must ``await engine.dispose()`` at shutdown.
    """
    return async_engine(
        options.url,
        connect_args={
            "timeout": options.connect_timeout_seconds,
            "server_settings": server_settings(options),
        },
        pool_size=ENGINE_POOL_SIZE,
        max_overflow=0,
        pool_timeout=options.retry_budget_seconds,
    )


def server_settings(options: DatabaseOptions) -> dict[str, str]:
    """Session settings of every connection, engine and pool alike (see :func:`create_engine`)."""
    return {
        "application_name": APPLICATION_NAME,
        "statement_timeout": _milliseconds(options.statement_timeout_seconds),
        "lock_timeout": _milliseconds(options.lock_timeout_seconds),
        # A worker killed mid-statement leaves its backend running until it next
        # writes to the socket; checking the client every second rolls such orphaned
        # work back and frees its stock row locks (PostgreSQL 14+).
        "client_connection_check_interval": "1000",
    }


async def _keep_session(_connection: asyncpg.Connection) -> None:
    """Pool ``reset`` hook that sends nothing.

    By default asyncpg resets a released connection with ``RESET ALL`` and more, a round trip
    per reservation; the hot path changes no session state, and asyncpg still rolls back a
    transaction left open (``Connection._reset``) before calling this.
    """


async def create_pool(options: DatabaseOptions) -> asyncpg.Pool:
    """Build (but do not connect) the asyncpg pool of the reservations.

    At most ``options.pool_size`` connections, opened on demand, with the session settings
    of :func:`server_settings`; a connection idle for 5 minutes is closed. Acquiring one waits
    at most ``retry_budget_seconds`` (the stock store's) and then raises ``TimeoutError``, which
    the retry policy treats as transient. A statement waits for its answer at most
    ``statement_timeout_seconds`` + :data:`CLIENT_TIMEOUT_MARGIN_SECONDS`, then raises
    ``TimeoutError`` too: a batch on a connection that stopped answering would otherwise hold
    its reservation slot until the kernel gave up on the socket, many minutes later. The caller
    owns the pool and must ``await pool.close()`` at shutdown.
    """
    return await asyncpg.create_pool(
        asyncpg_dsn(options.url),
        min_size=0,
        max_size=options.pool_size,
        timeout=options.connect_timeout_seconds,
        command_timeout=options.statement_timeout_seconds + CLIENT_TIMEOUT_MARGIN_SECONDS,
        server_settings=server_settings(options),
        reset=_keep_session,
    )
