"""What the roots build from the settings, and the start-up the services share.

The roots are ``entrypoints.worker``, ``entrypoints.relay``, ``entrypoints.dispatcher`` and
``entrypoints.cli`` for the tools. The adapters take plain values or a small frozen options
object, never :class:`Settings`; the translation that the roots share is written here once.
So are the checks that stop a service's start (an old schema, a service that refuses or does
not answer) and the exit codes they give, and the run of a pump with its HTTP server
(:func:`run_pump`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import ipaddress
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, NoReturn

import structlog
import uvicorn
import uvloop
from prometheus_client import CollectorRegistry
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from fulfilment import __version__
from fulfilment.adapters.postgres.engine import DatabaseOptions
from fulfilment.adapters.postgres.errors import DatabaseRefusedError, DatabaseUnavailableError
from fulfilment.adapters.postgres.errors import connection_failure as database_connection_failure
from fulfilment.adapters.postgres.privileges import missing_runtime_privileges
from fulfilment.adapters.postgres.schema import SchemaNotCurrentError, check_schema_current
from fulfilment.adapters.rabbitmq.connection import (
    BrokerRefusedError,
    BrokerUnavailableError,
    connect,
)
from fulfilment.exit_codes import ExitCode
from fulfilment.observability.logging import configure_logging
from fulfilment.observability.probes import ProbeServer, probe_app
from fulfilment.observability.tracing import start_tracing
from fulfilment.pump.leader import Pump
from fulfilment.settings import (
    DatabaseSettings,
    DeadlineSettings,
    Settings,
    SettingsError,
    load_settings,
)


class StartRefusedError(Exception):
    """A start-up check failed; the root logs it in one line and exits with ``exit_code``.

    ``event`` is that line's log event (``worker.schema_not_current``, ``relay.broker_refused``
    ...), the message the reason. ``exit_code`` is :attr:`ExitCode.UNAVAILABLE` when a
    service did not answer, :attr:`ExitCode.REFUSED` when it refused the user or has no
    such virtual host or database, or the URL's TLS or settings cannot work with it, else
    :attr:`ExitCode.FAILED`.
    """

    def __init__(self, reason: str, *, event: str, exit_code: ExitCode = ExitCode.FAILED) -> None:
        super().__init__(reason)
        self.event = event
        self.exit_code = exit_code

    @property
    def unreachable(self) -> bool:
        """True when a service did not answer: a wait may mend it, unlike a refusal."""
        return self.exit_code == ExitCode.UNAVAILABLE


def service_stops_start(
    failure: BrokerUnavailableError | DatabaseUnavailableError, *, program: str
) -> StartRefusedError:
    """The error that stops ``program``'s start (``worker``, ``relay``) for a service's ``failure``.

    Its event is ``<program>.<broker|database>_<refused|unreachable>``, its reason the first
    line of ``failure`` (which says which service, where, and why).
    """
    refused = isinstance(failure, BrokerRefusedError | DatabaseRefusedError)
    # Each event written out whole, so that a search for it finds it here.
    if isinstance(failure, BrokerUnavailableError):
        event = f"{program}.broker_refused" if refused else f"{program}.broker_unreachable"
    else:
        event = f"{program}.database_refused" if refused else f"{program}.database_unreachable"
    return StartRefusedError(
        str(failure).splitlines()[0],
        event=event,
        exit_code=ExitCode.REFUSED if refused else ExitCode.UNAVAILABLE,
    )


async def require_current_schema(engine: AsyncEngine, database_url: str, *, program: str) -> None:
    """Return when the database is at this build's alembic head and its user may do the work.

    A service that started before its migration would fail on a missing table or function
    (the relay on ``outbox``, the worker on ``place_orders()``); one whose user was granted
    less than ``privileges.RUNTIME_PRIVILEGES`` (a migration without
    ``FULFILMENT_DATABASE_RUNTIME_ROLE``, or granting another role) would dead-letter every
    order on ``insufficient_privilege``.

    Raises:
        StartRefusedError: ``<program>.privileges_missing`` (exit 4, as for a refused user),
            ``<program>.schema_not_current`` (exit 1); or, when the database refused
            ``database_url``'s user or does not answer, see :func:`service_stops_start`.
    """
    try:
        # The privileges first: without SELECT on alembic_version, the schema check alone
        # would name one table of the list.
        async with engine.connect() as connection:
            missing = await connection.run_sync(missing_runtime_privileges)
        if not missing:
            await check_schema_current(engine)
    except SchemaNotCurrentError as error:
        raise StartRefusedError(str(error), event=f"{program}.schema_not_current") from error
    except (OSError, TimeoutError, sa_exc.DBAPIError) as error:
        failure = database_connection_failure(database_url, error)
        raise service_stops_start(failure, program=program) from error
    if missing:
        user = make_url(database_url).username or ""
        msg = (
            f"the database user {user!r} may not do what the {program} does ({'; '.join(missing)}):"
            " run `fulfilment migrate` with FULFILMENT_DATABASE_RUNTIME_ROLE naming it"
            " (docs/security.md, 'Least privilege')"
        )
        raise StartRefusedError(
            msg, event=f"{program}.privileges_missing", exit_code=ExitCode.REFUSED
        )


async def require_broker(amqp_url: str, *, program: str, timeout_seconds: float) -> None:
    """Return when RabbitMQ at ``amqp_url`` accepts a connection (opened, then closed).

    Raises:
        StartRefusedError: the broker refused the login or the virtual host, or did not
            answer within ``timeout_seconds`` (see :func:`service_stops_start`).
    """
    try:
        async with connect(amqp_url, timeout_seconds=timeout_seconds):
            pass
    except BrokerUnavailableError as failure:
        raise service_stops_start(failure, program=program) from failure


def listen(host: str, port: int, *, program: str, port_variable: str) -> socket.socket:
    """A TCP socket listening on ``host`` (an IP address, as the settings ensure) and ``port``.

    For ``program``'s HTTP server, whose port is set by ``port_variable``
    (``FULFILMENT_HTTP_PORT``, ``FULFILMENT_RELAY_HTTP_PORT``). The roots bind it themselves and
    hand it to uvicorn: uvicorn's own bind failure is a bare log line and ``sys.exit(3)``, the
    code of a service that does not answer.

    Raises:
        StartRefusedError: ``<program>.http_listen_failed`` (exit 1) naming the address and
            the variable to change: a port another process holds, an address no interface
            of this host has, or another ``OSError`` of the bind.
    """
    ip = ipaddress.ip_address(host)
    address = f"[{host}]:{port}" if ip.version == 6 else f"{host}:{port}"  # noqa: PLR2004 - IPv6
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET  # noqa: PLR2004 - IPv6
    try:
        return socket.create_server((host, port), family=family)
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            fix = f"another process holds the port; set {port_variable} to a free one"
        elif error.errno == errno.EADDRNOTAVAIL:
            fix = "no interface of this host has that address; set FULFILMENT_HTTP_HOST to one"
        else:
            fix = f"check FULFILMENT_HTTP_HOST and {port_variable}"
        # os.strerror: create_server appends the address to the error's own strerror.
        said = f"[Errno {error.errno}] {os.strerror(error.errno)}" if error.errno else str(error)
        msg = f"the HTTP server of the {program} cannot listen on {address}: {fix}: {said}"
        raise StartRefusedError(msg, event=f"{program}.http_listen_failed") from error


def database_options(database: DatabaseSettings, deadlines: DeadlineSettings) -> DatabaseOptions:
    """The PostgreSQL options: ``database``'s URL, bounds and pool, ``deadlines``' retry budget."""
    return DatabaseOptions(
        url=database.url.get_secret_value(),
        connect_timeout_seconds=database.connect_timeout_seconds,
        statement_timeout_seconds=database.statement_timeout_seconds,
        lock_timeout_seconds=database.lock_timeout_seconds,
        retry_budget_seconds=deadlines.retry_budget_seconds,
        pool_size=database.pool_size,
    )


GC_YOUNG_THRESHOLD: Final = 50_000
"""Allocations (less deallocations) between two collections of the youngest generation, for
every service; CPython's default is 700. Each delivery or published event allocates a few
hundred objects, nearly all freed by reference counting, so at 700 the collector ran several
times per batch to find almost nothing, and its older generations followed more often (a
full collection of the relay's heap, which it does not freeze, takes 30 to 40 ms on an idle
core). With 50,000 the worker spent 0.94x to 0.95x and the relay 0.84x to 0.86x of the CPU
per order, at a peak RSS 4 MiB higher, and commit -> confirm p99 at 1,300 orders/s fell from
88 to 173 ms to 36 to 45 ms (docs/performance.md). The older generations keep their
defaults: collected after 10 young and 10 middle collections."""


def run_service(service: Callable[[Settings], Coroutine[Any, Any, int]]) -> NoReturn:
    """Run a service's coroutine from the environment's settings and exit with its code.

    Reads the settings (an invalid one: a line on standard error naming the variable, exit
    :attr:`ExitCode.BAD_INPUT`), configures logging, sets the collector's
    :data:`GC_YOUNG_THRESHOLD`, and runs ``service(settings)`` on the event loop that
    ``FULFILMENT_EVENT_LOOP`` names: uvloop by default, which spends less CPU per message than
    the standard library's loop (docs/performance.md).
    """
    try:
        settings = load_settings()
    except SettingsError as error:
        sys.stderr.write(f"fulfilment: invalid settings: {error}\n")
        sys.exit(ExitCode.BAD_INPUT)
    configure_logging(level=settings.process.log_level, log_format=settings.process.log_format)
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)
    loop_factory = uvloop.new_event_loop if settings.process.event_loop == "uvloop" else None
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            code = runner.run(_ignoring_stop_signals_once_done(service(settings)))
    except KeyboardInterrupt:
        # SIGINT before the service took the stop signals as its own (the first tenths of a
        # second): asyncio cancelled it; nothing was started that a drain would finish.
        sys.stderr.write("fulfilment: interrupted (Ctrl-C) before the service started\n")
        sys.exit(ExitCode.INTERRUPTED)
    sys.exit(code)


STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
"""The signals each service takes as a request to stop (drain, then exit 0)."""


async def _ignoring_stop_signals_once_done(service: Coroutine[Any, Any, int]) -> int:
    """``service``; once it has returned or raised, SIGTERM and SIGINT are ignored.

    The stop is decided by then, and its exit code with it. Closing the event loop would
    otherwise give SIGINT back to Python's default handler, and a repeated one would turn a
    clean stop into a ``KeyboardInterrupt`` and exit 130: a second Ctrl-C, or ``uv run``,
    which forwards a SIGINT sent to it to its child twice, 0.2 s apart.
    """
    try:
        return await service
    finally:
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)
            signal.signal(signum, signal.SIG_IGN)


async def run_pump(  # noqa: PLR0913 - what each program supplies, by name
    pump: Pump,
    *,
    registry: CollectorRegistry,
    host: str,
    port: int,
    port_variable: str,
    start: Callable[[], Awaitable[None]],
    **starting: object,
) -> ExitCode:
    """Run ``pump`` and its HTTP server until SIGTERM or SIGINT; return the exit code.

    In order: the HTTP socket on ``host`` and ``port`` (taken: exit 1,
    ``<name>.http_listen_failed``, naming ``port_variable``), tracing, the stop signals,
    ``<name>.starting`` with the version and ``starting``'s fields, the HTTP server
    (``/health/live``, ``/health/ready`` from :meth:`Pump.probe`, ``/metrics`` from
    ``registry``), then ``start()`` (the program's start-up checks, which may watch
    :attr:`Pump.stopping`), then :meth:`Pump.run`. A :class:`StartRefusedError` from
    ``start`` is logged in one line and its exit code returned; after a stop, 0. The HTTP
    server and tracing stop last.
    """
    name = pump.name
    logger = structlog.get_logger(f"fulfilment.{name}")
    try:
        listening = listen(host, port, program=name, port_variable=port_variable)
    except StartRefusedError as refused:
        logger.error(refused.event, reason=str(refused))  # noqa: TRY400 - one line, no trace
        return refused.exit_code
    tracing = start_tracing(registry, service_name=f"fulfilment-{name}", version=__version__)
    http = ProbeServer(
        uvicorn.Config(
            probe_app(readiness=pump.probe, registry=registry),
            host=host,
            port=port,
            lifespan="off",
            log_config=None,
            access_log=False,
        )
    )
    loop = asyncio.get_running_loop()
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, pump.stop)
    logger.info(pump.events.starting, version=__version__, **starting, http_port=port)
    serving = asyncio.create_task(http.serve(sockets=[listening]))
    try:
        await start()
        await pump.run()
    except StartRefusedError as refused:
        logger.error(refused.event, reason=str(refused))  # noqa: TRY400 - one line, no trace
        return refused.exit_code
    finally:
        http.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        if tracing is not None:
            await tracing.shutdown()
    return ExitCode.OK
