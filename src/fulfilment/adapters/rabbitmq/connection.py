"""Connecting to RabbitMQ, and what a failed or lost connection says in one line."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import aio_pika
import aiormq.exceptions

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection


class BrokerUnavailableError(Exception):
    """RabbitMQ cannot be reached, or refused the connection; the message says where.

    A refusal is the subclass :class:`BrokerRefusedError`.
    """


class BrokerRefusedError(BrokerUnavailableError):
    """RabbitMQ answered but refused the login or the virtual host; the message says which."""


# RabbitMQ closes the connection with 530 NOT_ALLOWED when asked for a virtual host that does
# not exist or that the user may not use (the two are one answer). aiormq 7.2 checks the reply's
# kind before it reads a Connection.Close, so it raises an InvalidFrameError naming the two
# frames and drops the code; a later aiormq may raise ConnectionClosed(530, text) instead.
_VHOST_REFUSED_FRAMES = ("Connection.OpenOk", "Connection.Close")
_NOT_ALLOWED = 530


def connection_failure(
    amqp_url: str, error: BaseException, *, timeout_seconds: float | None = None
) -> BrokerUnavailableError:
    """What a failed connection to ``amqp_url`` means, in one line without the password.

    ``timeout_seconds`` is how long opening the connection was given: a broker that did not
    answer in that time (``TimeoutError``, which says nothing) is said to be so, with the
    seconds.

    A :class:`BrokerRefusedError` when the broker answered and refused the login (a wrong user
    or password, aiormq's ``ProbableAuthenticationError`` for ACCESS_REFUSED, or no common
    authentication mechanism) or the virtual host (missing, or not permitted to the user);
    when it refused an operation the user's permissions do not allow (``ACCESS_REFUSED``, 403,
    on a channel: a declaration, a binding, a publish or a read of a name outside them);
    when it presented a TLS certificate that did not verify (``ssl.SSLCertVerificationError``:
    a CA other than the URL's ``cafile``, or a host name the certificate does not name);
    when a TLS file the URL names cannot be read; or when an ``amqps://`` URL's port answers
    without TLS (``WRONG_VERSION_NUMBER``: the plain AMQP port, 5672, say). Retrying mends
    none of these. Otherwise a :class:`BrokerUnavailableError` (refused or reset connection,
    DNS failure, time-out, a closed connection).
    """
    url = aio_pika.connection.make_url(amqp_url)
    where = _without_password(amqp_url)
    user = url.user or "guest"
    refusal = _tls_refusal(error, port=url.port or 5671)  # aiormq's default for amqps://
    if refusal is not None:
        return BrokerRefusedError(f"RabbitMQ at {where}{refusal}")
    if isinstance(
        error,
        aiormq.exceptions.ProbableAuthenticationError | aiormq.exceptions.AuthenticationError,
    ):
        return BrokerRefusedError(
            f"RabbitMQ at {where} refused the login of user {user!r}:"
            f" {type(error).__name__}: {error}"
        )
    if isinstance(error, aiormq.exceptions.ChannelAccessRefused):
        return BrokerRefusedError(
            f"RabbitMQ at {where} refused user {user!r} an operation its permissions do not"
            f" allow: {error.args[0] if error.args else error}"
        )
    frames = str(error)
    vhost_refused = (
        isinstance(error, aiormq.exceptions.InvalidFrameError)
        and all(frame in frames for frame in _VHOST_REFUSED_FRAMES)
    ) or (
        isinstance(error, aiormq.exceptions.ConnectionClosed) and error.args[:1] == (_NOT_ALLOWED,)
    )
    if vhost_refused:
        vhost = url.path[1:].replace("%2F", "/") or "/"  # as aiormq reads it
        return BrokerRefusedError(
            f"RabbitMQ at {where} refused virtual host {vhost!r}: it does not exist, or user"
            f" {user!r} may not use it"
        )
    if isinstance(error, TimeoutError | asyncio.CancelledError):
        within = (
            "in the time allowed" if timeout_seconds is None else f"within {timeout_seconds:g} s"
        )
        return BrokerUnavailableError(
            f"RabbitMQ at {where} is not reachable: opening a connection got no answer {within}"
        )
    return BrokerUnavailableError(
        f"RabbitMQ at {where} is not reachable: {type(error).__name__}: {error}"
    )


def closed_reason(connection: AbstractConnection) -> BaseException | None:
    """Why ``connection`` closed under its user (the error its reader stopped on), else None.

    None while it is open, and for a connection that was never opened or that its user
    closed. aio-pika 10.2.1's own ``is_closed`` stays False when the broker drops the connection
    (a restart, a closed socket): only aiormq's connection under it knows, and its ``closing``
    future holds the reason (``ConnectionClosed(320, 'CONNECTION_FORCED ...')``, an
    ``AMQPConnectionError`` for a socket closed without a word).
    """
    underlay = connection.transport
    if underlay is None or not underlay.connection.is_closed:
        return None
    closing = underlay.connection.closing
    if closing.cancelled():
        return ConnectionError("the connection was closed")
    return closing.exception() or ConnectionError("the connection was closed")


@contextlib.contextmanager
def connection_lost(connection: AbstractConnection, amqp_url: str) -> Iterator[None]:
    """Raise a lost ``connection`` (to ``amqp_url``) as a one-line failure without the password.

    For the operations on an open connection that the broker may drop meanwhile: a channel
    asked of a connection aiormq saw close raises a bare ``RuntimeError('<Connection ...>
    closed')``, a frame lost on the way an ``AMQPConnectionError``. Any other error, on a
    connection still open, passes unchanged.

    Raises:
        BrokerUnavailableError: the block failed and the connection is closed, with the
            reason it closed (a ``BrokerRefusedError`` when that reason is a refusal).
    """
    try:
        yield
    except BrokerUnavailableError:
        raise
    except Exception as error:
        reason = closed_reason(connection)
        if reason is None and not isinstance(error, aiormq.exceptions.AMQPConnectionError):
            raise
        failure = connection_failure(amqp_url, reason or error)
        if isinstance(failure, BrokerRefusedError):
            raise failure from error
        cause = reason or error
        msg = (
            f"the connection to RabbitMQ at {_without_password(amqp_url)} was lost:"
            f" {type(cause).__name__}: {cause}"
        )
        raise BrokerUnavailableError(msg) from error


def _without_password(amqp_url: str) -> str:
    """``amqp_url`` as a line may show it: its password, if any, as ``***``."""
    url = aio_pika.connection.make_url(amqp_url)
    return str(url.with_password("***") if url.password is not None else url)


def _tls_refusal(error: BaseException, *, port: int) -> str | None:
    """What in the URL's TLS ``error`` refuses (``: the server's TLS ...``), else None."""
    cause = _tls_cause(error)
    if isinstance(cause, ssl.SSLCertVerificationError):
        return (
            ": the server's TLS certificate did not verify"
            f" (the URL's cafile CA and host name): {type(cause).__name__}: {cause}"
        )
    if cause is not None:
        return (
            ": a TLS file the URL names cannot be read"
            f" (cafile, capath, certfile, keyfile): {type(cause).__name__}: {cause}"
        )
    if _plain_port(error):
        return (
            f" does not speak TLS on port {port}, which amqps:// asks for (the TLS port is"
            f" 5671 by default; amqp:// for the plain port): {type(error).__name__}: {error}"
        )
    return None


def _tls_cause(error: BaseException) -> BaseException | None:
    """The failed certificate check or unreadable TLS file behind ``error``, else None.

    aiormq raises ``AMQPConnectionError`` from the handshake's ``SSLCertVerificationError``
    (an ``OSError``); a CA or certificate file that is missing reaches the caller as the
    ``FileNotFoundError`` (or ``PermissionError``, ``IsADirectoryError``) of building the TLS
    context, before any connection is tried.
    """
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen
        if isinstance(seen, FileNotFoundError | PermissionError | IsADirectoryError):
            return seen
        seen = seen.__cause__
    return None


_PLAIN_ANSWER = "WRONG_VERSION_NUMBER"
"""OpenSSL's reason when the server's first bytes are no TLS record: RabbitMQ's plain port
answers a TLS hello with the AMQP protocol header."""


def _plain_port(error: BaseException) -> bool:
    """True when ``error`` comes from a TLS handshake that a server without TLS answered.

    aiormq raises ``AMQPConnectionError`` from the handshake's ``ssl.SSLError``.
    """
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ssl.SSLError) and seen.reason == _PLAIN_ANSWER:
            return True
        seen = seen.__cause__
    return False


@contextlib.asynccontextmanager
async def connect(
    amqp_url: str, *, timeout_seconds: float = 10.0
) -> AsyncIterator[AbstractConnection]:
    """A plain (not robust) connection, closed on exit.

    Raises:
        BrokerUnavailableError: the broker does not answer, or (a ``BrokerRefusedError``)
            refuses the login or the virtual host.
    """
    try:
        connection = await aio_pika.connect(amqp_url, timeout=timeout_seconds)
    except (OSError, TimeoutError, aiormq.exceptions.AMQPError) as error:
        raise connection_failure(amqp_url, error, timeout_seconds=timeout_seconds) from error
    try:
        yield connection
    finally:
        await connection.close()
