"""What a failed connection means: unreachable (exit 3) or refused (exit 4), in one line.

The errors are built as the client libraries raise them, or raised by them against a local
socket; ``tests/integration/test_cli_refusals.py`` and ``tests/e2e/test_health_probes.py`` get
them from the real services.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aio_pika
import asyncpg
import pytest
from aiormq.exceptions import (
    AMQPConnectionError,
    ChannelAccessRefused,
    ConnectionClosed,
    InvalidFrameError,
    ProbableAuthenticationError,
)
from sqlalchemy.exc import DBAPIError

from fulfilment.adapters.postgres import errors as database
from fulfilment.adapters.postgres.engine import asyncpg_dsn
from fulfilment.adapters.rabbitmq import connection as broker

BROKER = "amqp://orders:s3cret@rabbit:5672/shop"
DATABASE = "postgresql+asyncpg://orders:s3cret@db:5432/fulfilment"
_UNRECOGNIZED = 'unrecognized configuration parameter "{}"'


def test_a_refused_broker_login_names_the_user_not_the_password() -> None:
    failure = broker.connection_failure(
        BROKER, ProbableAuthenticationError("ACCESS_REFUSED - Login was refused")
    )

    assert isinstance(failure, broker.BrokerRefusedError)
    assert str(failure) == (
        "RabbitMQ at amqp://orders:***@rabbit:5672/shop refused the login of user 'orders':"
        " ProbableAuthenticationError: ACCESS_REFUSED - Login was refused"
    )


@pytest.mark.parametrize(
    "error",
    [
        # aiormq 7.2: the Connection.Close that answers Connection.Open, seen as a wrong frame.
        InvalidFrameError(
            "Expected one of ['Connection.OpenOk'], got <Connection.Close object at 0x7f>"
        ),
        # What it raises once it reads the Connection.Close first.
        ConnectionClosed(530, "NOT_ALLOWED - vhost shop not found"),
    ],
    ids=["invalid-frame", "connection-closed"],
)
def test_a_refused_virtual_host_is_named(error: Exception) -> None:
    failure = broker.connection_failure(BROKER, error)

    assert isinstance(failure, broker.BrokerRefusedError)
    assert str(failure) == (
        "RabbitMQ at amqp://orders:***@rabbit:5672/shop refused virtual host 'shop':"
        " it does not exist, or user 'orders' may not use it"
    )


def test_a_broker_certificate_that_does_not_verify_is_a_refusal_naming_the_url() -> None:
    url = "amqps://orders:s3cret@rabbit:5671/shop?cafile=/etc/ca.crt"
    verification = ssl.SSLCertVerificationError(
        1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate"
    )
    # As aiormq's TLS transport raises it.
    error = AMQPConnectionError(*verification.args)
    error.__cause__ = verification

    failure = broker.connection_failure(url, error)

    assert isinstance(failure, broker.BrokerRefusedError)
    assert str(failure) == (
        "RabbitMQ at amqps://orders:***@rabbit:5671/shop?cafile=/etc/ca.crt: the server's TLS"
        " certificate did not verify (the URL's cafile CA and host name):"
        " SSLCertVerificationError: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed:"
        " self-signed certificate"
    )


def test_an_operation_outside_the_users_permissions_is_a_refusal() -> None:
    error = ChannelAccessRefused(
        "ACCESS_REFUSED - access to queue 'fulfilment.order-placed' in vhost 'shop' refused for"
        " user 'orders'"
    )

    failure = broker.connection_failure(BROKER, error)

    assert isinstance(failure, broker.BrokerRefusedError)
    assert str(failure) == (
        "RabbitMQ at amqp://orders:***@rabbit:5672/shop refused user 'orders' an operation its"
        " permissions do not allow: ACCESS_REFUSED - access to queue 'fulfilment.order-placed'"
        " in vhost 'shop' refused for user 'orders'"
    )


def test_a_broker_ca_file_that_cannot_be_read_is_a_refusal() -> None:
    url = "amqps://orders:s3cret@rabbit:5671/shop?cafile=/no/ca.crt"

    failure = broker.connection_failure(url, FileNotFoundError(2, "No such file or directory"))

    assert isinstance(failure, broker.BrokerRefusedError)
    assert "a TLS file the URL names cannot be read" in str(failure)
    assert "s3cret" not in str(failure)


def test_a_server_certificate_that_does_not_verify_is_a_refusal_naming_the_url() -> None:
    url = DATABASE + "?sslmode=verify-full&sslrootcert=/etc/ca.crt"
    error = ssl.SSLCertVerificationError(
        1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate"
    )

    failure = database.connection_failure(url, error)

    assert isinstance(failure, database.DatabaseRefusedError)
    assert str(failure) == (
        "PostgreSQL at postgresql+asyncpg://orders:***@db:5432/fulfilment"
        "?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.crt: the server's TLS certificate did not"
        " verify (the URL's sslrootcert CA and host name): SSLCertVerificationError:"
        " [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed:"
        " self-signed certificate"
    )


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError(111, "Connect call failed"),
        TimeoutError(),
        ConnectionClosed(320, "CONNECTION_FORCED - broker forced connection closure"),
        InvalidFrameError("Expected Connection.Start, got <Heartbeat>"),
    ],
)
def test_a_broker_that_does_not_let_us_in_for_another_reason_is_unreachable(
    error: Exception,
) -> None:
    failure = broker.connection_failure(BROKER, error)

    assert type(failure) is broker.BrokerUnavailableError
    assert str(failure).startswith(
        "RabbitMQ at amqp://orders:***@rabbit:5672/shop is not reachable: "
    )


def test_a_broker_url_without_credentials_gains_no_password_mask() -> None:
    failure = broker.connection_failure("amqp://rabbit/", ConnectionRefusedError(111, "refused"))

    assert str(failure) == (
        "RabbitMQ at amqp://rabbit/ is not reachable: ConnectionRefusedError: [Errno 111] refused"
    )


async def test_a_broker_that_never_answers_is_unreachable_after_the_seconds_it_was_given() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # listens, never answers
        port = silent.getsockname()[1]
        with pytest.raises(broker.BrokerUnavailableError) as raised:
            async with broker.connect(f"amqp://guest@127.0.0.1:{port}/", timeout_seconds=0.5):
                pass

    assert str(raised.value) == (
        f"RabbitMQ at amqp://guest@127.0.0.1:{port}/ is not reachable: opening a connection got"
        " no answer within 0.5 s"
    )


class _AdaptedError(Exception):
    """The dialect's own error class: asyncpg's message and SQLSTATE, raised from it."""

    def __init__(self, error: asyncpg.PostgresError) -> None:
        super().__init__(str(error))
        self.sqlstate = error.sqlstate
        self.__cause__ = error


def _wrapped(error: asyncpg.PostgresError) -> DBAPIError:
    """``error`` as SQLAlchemy's asyncpg dialect raises it from an engine."""
    adapted = _AdaptedError(error)
    wrapped = DBAPIError("SELECT 1", None, adapted)
    wrapped.__cause__ = adapted
    return wrapped


@pytest.mark.parametrize("wrap", [lambda error: error, _wrapped], ids=["asyncpg", "sqlalchemy"])
@pytest.mark.parametrize(
    ("error", "said"),
    [
        (
            asyncpg.InvalidPasswordError('password authentication failed for user "orders"'),
            'InvalidPasswordError: password authentication failed for user "orders"',
        ),
        (
            asyncpg.InvalidAuthorizationSpecificationError(
                'no pg_hba.conf entry for host "10.0.0.1", user "orders"'
            ),
            (
                "InvalidAuthorizationSpecificationError:"
                ' no pg_hba.conf entry for host "10.0.0.1", user "orders"'
            ),
        ),
        (
            asyncpg.InsufficientPrivilegeError('permission denied for database "fulfilment"'),
            'InsufficientPrivilegeError: permission denied for database "fulfilment"',
        ),
    ],
)
def test_a_refused_database_user_is_named_without_the_password(wrap, error, said) -> None:
    failure = database.connection_failure(DATABASE, wrap(error))

    assert isinstance(failure, database.DatabaseRefusedError)
    assert str(failure) == (
        f"PostgreSQL at postgresql+asyncpg://orders:***@db:5432/fulfilment refused user"
        f" 'orders': {said}"
    )


@pytest.mark.parametrize("wrap", [lambda error: error, _wrapped], ids=["asyncpg", "sqlalchemy"])
def test_a_missing_database_is_told_apart_from_an_unreachable_server(wrap) -> None:
    error = asyncpg.InvalidCatalogNameError('database "fulfilment" does not exist')

    failure = database.connection_failure(DATABASE, wrap(error))

    assert isinstance(failure, database.DatabaseRefusedError)
    assert str(failure) == (
        "PostgreSQL at postgresql+asyncpg://orders:***@db:5432/fulfilment has no such database"
        " (fulfilment migrate creates it): InvalidCatalogNameError:"
        ' database "fulfilment" does not exist'
    )


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError(111, "Connect call failed"),
        asyncpg.CannotConnectNowError("the database system is starting up"),
        asyncpg.TooManyConnectionsError("sorry, too many clients already"),
    ],
)
def test_a_database_that_does_not_let_us_in_for_another_reason_is_unreachable(error) -> None:
    failure = database.connection_failure(DATABASE, error)

    assert type(failure) is database.DatabaseUnavailableError
    assert str(failure).startswith(
        "PostgreSQL at postgresql+asyncpg://orders:***@db:5432/fulfilment is not reachable: "
        f"{type(error).__name__}"
    )


async def test_a_database_that_never_answers_is_unreachable_after_the_seconds_it_was_given() -> (
    None
):
    with socket.create_server(("127.0.0.1", 0)) as silent:  # listens, never answers
        port = silent.getsockname()[1]
        url = f"postgresql+asyncpg://orders:s3cret@127.0.0.1:{port}/fulfilment"
        with pytest.raises(TimeoutError) as raised:
            await asyncpg.connect(asyncpg_dsn(url), timeout=0.5)

    failure = database.connection_failure(url, raised.value, timeout_seconds=0.5)

    assert type(failure) is database.DatabaseUnavailableError
    assert str(failure) == (
        f"PostgreSQL at postgresql+asyncpg://orders:***@127.0.0.1:{port}/fulfilment is not"
        " reachable: opening a connection got no answer within 0.5 s"
    )


async def _raised_by_connect(dsn: str) -> BaseException:
    """What ``asyncpg.connect(dsn)`` raises (each case below fails before or at the TLS step)."""
    with pytest.raises(Exception) as raised:  # noqa: PT011 - the cases assert the type
        await asyncpg.connect(dsn, timeout=5)
    return raised.value


@contextlib.asynccontextmanager
async def _server_answering(first_answer: bytes) -> AsyncIterator[int]:
    """A local TCP server that answers its client's first bytes with ``first_answer`` and
    closes; yields its port. PostgreSQL without TLS answers a TLS request with ``N``; RabbitMQ's
    plain port answers a TLS hello with the AMQP protocol header."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)
        writer.write(first_answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def test_a_database_tls_file_that_cannot_be_read_is_a_refusal_naming_the_file() -> None:
    url = DATABASE + "?sslmode=verify-full&sslrootcert=/nonexistent/ca.crt"
    error = await _raised_by_connect(asyncpg_dsn(url))

    failure = database.connection_failure(url, error)

    assert isinstance(failure, database.DatabaseRefusedError)
    assert str(failure) == (
        "PostgreSQL at postgresql+asyncpg://orders:***@db:5432/fulfilment"
        "?sslmode=verify-full&sslrootcert=%2Fnonexistent%2Fca.crt: a TLS file the URL names"
        " cannot be read (sslrootcert=/nonexistent/ca.crt): FileNotFoundError: [Errno 2] No"
        " such file or directory"
    )


async def test_verify_full_without_a_root_certificate_is_a_refusal(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.postgresql/root.crt
    monkeypatch.delenv("PGSSLROOTCERT", raising=False)
    url = DATABASE + "?sslmode=verify-full"
    error = await _raised_by_connect(asyncpg_dsn(url))

    failure = database.connection_failure(url, error)

    assert isinstance(failure, database.DatabaseRefusedError)
    assert str(failure).startswith(
        "PostgreSQL at postgresql+asyncpg://orders:***@db:5432/fulfilment?sslmode=verify-full:"
        " the URL's connection parameters cannot be used: ClientConfigurationError: root"
        f' certificate file "{tmp_path}/.postgresql/root.crt" does not exist'
    )


async def test_sslmode_require_against_a_server_without_tls_is_a_refusal() -> None:
    async with _server_answering(b"N") as port:
        url = f"postgresql+asyncpg://orders:s3cret@127.0.0.1:{port}/fulfilment?sslmode=require"
        error = await _raised_by_connect(asyncpg_dsn(url))

    failure = database.connection_failure(url, error)

    assert isinstance(failure, database.DatabaseRefusedError)
    assert str(failure) == (
        f"PostgreSQL at postgresql+asyncpg://orders:***@127.0.0.1:{port}/fulfilment"
        "?sslmode=require does not offer TLS, which the URL's sslmode asks for (use"
        " sslmode=disable or prefer for a server without TLS): ConnectionError: PostgreSQL"
        f' server at "127.0.0.1:{port}" rejected SSL upgrade'
    )


@pytest.mark.parametrize("query", ["", "?sslmode=prefer"], ids=["no sslmode", "prefer"])
async def test_a_port_that_is_not_postgresql_s_is_said_to_be_so_not_blamed_on_tls(
    monkeypatch: pytest.MonkeyPatch, query: str
) -> None:
    monkeypatch.delenv("PGSSLMODE", raising=False)
    async with _server_answering(b"AMQP\x00\x00\x09\x01") as port:  # RabbitMQ's answer
        url = f"postgresql+asyncpg://orders:s3cret@127.0.0.1:{port}/fulfilment{query}"
        error = await _raised_by_connect(asyncpg_dsn(url))

    failure = database.connection_failure(url, error)

    assert isinstance(failure, database.DatabaseRefusedError)
    assert str(failure) == (
        f"PostgreSQL at postgresql+asyncpg://orders:***@127.0.0.1:{port}/fulfilment{query}:"
        " what answers there is not PostgreSQL (it answered the TLS request a connection opens"
        " with, sslmode=prefer, with neither yes nor no): is the port PostgreSQL's?"
    )


@pytest.mark.parametrize("wrap", [lambda error: error, _wrapped], ids=["asyncpg", "sqlalchemy"])
@pytest.mark.parametrize(
    ("query", "setting", "error"),
    [
        (
            "sslmod=require",
            "sslmod",
            asyncpg.UndefinedObjectError(_UNRECOGNIZED.format("sslmod")),
        ),
        (
            "application_name=x&timezone=Nowhere",
            "timezone",
            asyncpg.InvalidParameterValueError('invalid value for parameter "TimeZone": "Nowhere"'),
        ),
        (
            "shared_buffers=1",
            "shared_buffers",
            asyncpg.CantChangeRuntimeParamError(
                'parameter "shared_buffers" cannot be changed without restarting the server'
            ),
        ),
    ],
    ids=["unknown", "bad-value", "server-only"],
)
def test_a_setting_of_the_url_the_server_refuses_is_a_refusal_naming_it(
    wrap, query: str, setting: str, error: asyncpg.PostgresError
) -> None:
    url = f"{DATABASE}?{query}"

    failure = database.connection_failure(url, wrap(error))

    assert isinstance(failure, database.DatabaseRefusedError)
    assert str(failure) == (
        f"PostgreSQL at postgresql+asyncpg://orders:***@db:5432/fulfilment?{query} refused the"
        f" setting {setting}= of FULFILMENT_DATABASE_URL (a query parameter that is not a"
        " connection parameter reaches the server as a setting):"
        f" {type(error).__name__}: {error}"
    )


def test_an_undefined_object_that_is_no_setting_of_the_url_is_not_taken_for_one() -> None:
    url = f"{DATABASE}?application_name=orders"
    error = asyncpg.UndefinedObjectError(_UNRECOGNIZED.format("jit_above_cost"))

    failure = database.connection_failure(url, error)

    assert type(failure) is database.DatabaseUnavailableError


async def test_amqps_to_a_port_without_tls_is_a_refusal_naming_the_port() -> None:
    async with _server_answering(b"AMQP\x00\x00\x09\x01") as port:
        url = f"amqps://orders:s3cret@127.0.0.1:{port}/shop"
        with pytest.raises(AMQPConnectionError) as raised:
            await aio_pika.connect(url, timeout=5)

    failure = broker.connection_failure(url, raised.value)

    assert isinstance(failure, broker.BrokerRefusedError)
    assert str(failure).startswith(
        f"RabbitMQ at amqps://orders:***@127.0.0.1:{port}/shop does not speak TLS on port"
        f" {port}, which amqps:// asks for (the TLS port is 5671 by default; amqp:// for the"
        " plain port): AMQPConnectionError: "
    )
    assert "WRONG_VERSION_NUMBER" in str(failure)
