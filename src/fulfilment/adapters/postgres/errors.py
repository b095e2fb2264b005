"""Errors of the PostgreSQL adapter that callers can act on."""

from __future__ import annotations

import asyncio
import os
import ssl
import urllib.parse
from collections.abc import Iterable
from pathlib import Path

import asyncpg
from sqlalchemy.engine import make_url

from fulfilment.asyncpg_url import ASYNCPG_URL_PARAMETERS

SESSION_LOST_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.ReadOnlySQLTransactionError,
    # The protocol out of step with its connection ("cannot switch to state 12; another
    # operation (2) is in progress"), which a server that ends the connection just as a
    # statement starts or answers leaves behind (a failover); TargetServerAttributeNotMatched
    # (no primary among the URL's hosts) is one too.
    asyncpg.InternalClientError,
)
"""What ends a session held for a lock (the relay's, the dispatcher's) and calls for a new one:
a server that is down, restarting or closed the connection (``admin_shutdown``,
``cannot_connect_now``), and during a failover also a server that became a standby
(``read_only_sql_transaction``), no primary among the URL's hosts, or a connection the failover
left out of step."""

SKUS_SHOWN = 10
"""SKUs named in the message; ``skus`` holds them all."""


class StockBelowReservedError(ValueError):
    """A new ``on_hand`` would fall below what is already reserved for some SKUs.

    Raised by ``PostgresStock.put_stock`` (and the in-memory fake) before any level is
    changed: a load never makes a SKU short (``reserved > on_hand`` arises only from a
    reported loss, ``fulfilment.domain.adjustments``).
    ``skus`` are the offending SKUs, sorted by code point.
    """

    def __init__(self, skus: Iterable[str]) -> None:
        self.skus: tuple[str, ...] = tuple(sorted(skus))
        shown = ", ".join(repr(sku) for sku in self.skus[:SKUS_SHOWN])
        hidden = len(self.skus) - SKUS_SHOWN
        more = f" and {hidden} more" if hidden > 0 else ""
        super().__init__(f"on_hand would fall below reserved units for {shown}{more}")


class DatabaseUnavailableError(Exception):
    """PostgreSQL cannot be reached, or refused the connection; the message says where.

    A refusal is the subclass :class:`DatabaseRefusedError`.
    """


class DatabaseRefusedError(DatabaseUnavailableError):
    """PostgreSQL answered but refused the user or has no such database; the message says which."""


_MISSING_DATABASE = "3D000"
"""``invalid_catalog_name``: the database of the URL does not exist."""
_REFUSED_CLASSES = ("28", "42501")
"""SQLSTATE class 28 (invalid authorization: unknown role, wrong password, no ``pg_hba.conf``
entry) and ``insufficient_privilege`` (no CONNECT privilege on the database, say)."""


def connection_failure(
    url: str, error: BaseException, *, timeout_seconds: float | None = None
) -> DatabaseUnavailableError:
    """What a failed connection to ``url`` means, in one line without the password.

    ``timeout_seconds`` is how long opening the connection was given: a server that did not
    answer in that time is said to be so, with the seconds (:func:`timed_out`).

    ``error`` is asyncpg's, an ``OSError`` or ``TimeoutError``, or SQLAlchemy's wrapper of
    one; the line names the driver's own error (innermost cause). A :class:`DatabaseRefusedError`
    when the server refused the user (SQLSTATE class 28, ``InvalidPasswordError``,
    ``InvalidAuthorizationSpecificationError``; or 42501; also a ``pg_hba.conf`` that takes
    only TLS connections, ``hostssl``, refusing ``sslmode=disable``), has no such database
    (3D000), or presented a certificate that did not verify against the URL's ``sslrootcert``
    (``ssl.SSLCertVerificationError``, a wrong CA or host name); when what answers is not
    PostgreSQL (its answer to the TLS request is neither yes nor no); when a TLS file the URL names
    cannot be read (``FileNotFoundError`` and the like, before any connection is tried) or
    asyncpg finds the URL's parameters unusable (``ClientConfigurationError``); when the
    server does not offer the TLS that ``sslmode=require`` (or stricter) asks for; or when it
    refused a setting of the URL (a query parameter asyncpg does not read, sent to the server
    as a setting: ``asyncpg_url.ASYNCPG_URL_PARAMETERS``). Retrying mends none of these. Otherwise a
    :class:`DatabaseUnavailableError`.
    """
    parsed = make_url(url)
    where = parsed.render_as_string(hide_password=True)
    cause, sqlstate = _driver_error(error)
    said = f"{type(cause).__name__}: {cause}"
    unanswered = _unanswered(url, where, error, timeout_seconds)
    if unanswered is not None:
        return unanswered
    refusal = _setting_refusal(url, cause, sqlstate)
    if refusal is not None:
        return DatabaseRefusedError(f"PostgreSQL at {where}{refusal}: {said}")
    if isinstance(cause, ssl.SSLCertVerificationError):
        # A wrong CA file or host name: retrying cannot mend it, like a refused password.
        return DatabaseRefusedError(
            f"PostgreSQL at {where}: the server's TLS certificate did not verify"
            f" (the URL's sslrootcert CA and host name): {said}"
        )
    if sqlstate == _MISSING_DATABASE:
        return DatabaseRefusedError(
            f"PostgreSQL at {where} has no such database (fulfilment migrate creates it): {said}"
        )
    if sqlstate is not None and sqlstate.startswith(_REFUSED_CLASSES):
        return DatabaseRefusedError(
            f"PostgreSQL at {where} refused user {parsed.username or ''!r}: {said}"
        )
    return DatabaseUnavailableError(f"PostgreSQL at {where} is not reachable: {said}")


def _unanswered(
    url: str, where: str, error: BaseException, timeout_seconds: float | None
) -> DatabaseUnavailableError | None:
    """The failure when no PostgreSQL answered at ``url`` (``where``, without its password).

    Unreachable when nothing answered within ``timeout_seconds``; refused when what answered
    is not PostgreSQL: its answer to the TLS request asyncpg opens with (sslmode ``prefer``,
    its default) is neither yes nor no, which asyncpg words as a rejected TLS upgrade. Else
    None.
    """
    if timed_out(error):
        return DatabaseUnavailableError(
            f"PostgreSQL at {where} is not reachable: {no_answer(timeout_seconds)}"
        )
    cause, _ = _driver_error(error)
    sslmode = _sslmode(url)
    if (
        isinstance(cause, ConnectionError)
        and _NO_TLS in str(cause)
        and sslmode not in _TLS_REQUIRED
    ):
        return DatabaseRefusedError(
            f"PostgreSQL at {where}: what answers there is not PostgreSQL (it answered the TLS"
            f" request a connection opens with, sslmode={sslmode}, with neither yes nor no):"
            " is the port PostgreSQL's?"
        )
    return None


def timed_out(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from, is a time-out.

    asyncpg's ``timeout`` raises a ``TimeoutError`` from the ``CancelledError`` of the attempt
    (``asyncio.timeout``); neither says anything (``str()`` is empty), so a line naming them
    alone would read ``CancelledError:``.
    """
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, TimeoutError | asyncio.CancelledError):
            return True
        seen = seen.__cause__
    return False


def no_answer(timeout_seconds: float | None) -> str:
    """``opening a connection got no answer within 5 s``: what a connection's time-out means."""
    within = "in the time allowed" if timeout_seconds is None else f"within {timeout_seconds:g} s"
    return f"opening a connection got no answer {within}"


TLS_FILE_PARAMETERS = ("sslrootcert", "sslcert", "sslkey", "sslcrl")
"""The URL's query parameters that name a file asyncpg reads to build the TLS context."""

_UNREADABLE_FILE = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)

_NO_TLS = "rejected SSL upgrade"
"""asyncpg's ``ConnectionError`` text when the server answers its TLS request otherwise than
with "yes": with "no" under an sslmode that requires TLS, or with anything but "yes" or "no"
(a server that is not PostgreSQL) under any sslmode that asks (asyncpg 0.31,
``connect_utils.TLSUpgradeProto``)."""

_TLS_REQUIRED = frozenset({"require", "verify-ca", "verify-full"})
"""The sslmodes under which a server that answers "no" to the TLS request is refused; under
``prefer`` (asyncpg's default, without sslmode) and ``allow`` the connection goes on in plain."""

_SETTING_REFUSED = ("42704", "22023", "55P02")
"""What a server says of a bad setting in the start-up packet: ``undefined_object``
(unrecognized configuration parameter), ``invalid_parameter_value`` (a bad value) and
``cant_change_runtime_param`` (a setting of the server's own, such as ``shared_buffers``)."""


def _setting_refusal(url: str, cause: BaseException, sqlstate: str | None) -> str | None:
    """What in the URL's settings ``cause`` refuses (``: a TLS file ...``), else None."""
    if isinstance(cause, _UNREADABLE_FILE):
        return f": a TLS file the URL names cannot be read ({_unreadable_tls_files(url)})"
    if isinstance(cause, asyncpg.ClientConfigurationError):
        return ": the URL's connection parameters cannot be used"
    if isinstance(cause, ConnectionError) and _NO_TLS in str(cause):
        return (
            " does not offer TLS, which the URL's sslmode asks for"
            " (use sslmode=disable or prefer for a server without TLS)"
        )
    setting = _refused_setting(url, sqlstate, cause)
    if setting is not None:
        return (
            f" refused the setting {setting}= of FULFILMENT_DATABASE_URL (a query parameter"
            " that is not a connection parameter reaches the server as a setting)"
        )
    return None


def _sslmode(url: str) -> str:
    """The sslmode asyncpg connects ``url`` with: the URL's, else ``PGSSLMODE``, else prefer."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    given = query.get("sslmode") or query.get("ssl") or [os.environ.get("PGSSLMODE", "prefer")]
    return given[-1]


def _unreadable_tls_files(url: str) -> str:
    """``name=path`` of the URL's TLS files that are not readable files, else their names."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    named = [(name, path) for name in TLS_FILE_PARAMETERS for path in query.get(name, [])]
    unreadable = [
        f"{name}={path}"
        for name, path in named
        if not (Path(path).is_file() and os.access(path, os.R_OK))
    ]
    return ", ".join(unreadable or TLS_FILE_PARAMETERS)


def _refused_setting(url: str, sqlstate: str | None, cause: BaseException) -> str | None:
    """The URL's setting that the server's ``cause`` names, if it refused one, else None.

    The server's message quotes the setting's name (in its own casing: ``TimeZone``), so the
    name is matched without case; an error on a setting the service sets itself
    (``engine.server_settings``) names none of the URL's.
    """
    if sqlstate not in _SETTING_REFUSED:
        return None
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    said = str(cause).lower()
    for name in query:
        if name not in ASYNCPG_URL_PARAMETERS and f'"{name.lower()}"' in said:
            return name
    return None


INSUFFICIENT_PRIVILEGE = "42501"
"""``insufficient_privilege``: the user may not do this to this object."""


def privilege_refusal(error: BaseException) -> DatabaseRefusedError | None:
    """A one-line refusal when ``error`` is PostgreSQL's ``insufficient_privilege``, else None.

    An operator command run with the runtime role's URL (docs/security.md, "Least privilege")
    meets it on the first statement the role may not run: the line names the statement's
    object and says which role the command needs.
    """
    cause, sqlstate = _driver_error(error)
    if sqlstate != INSUFFICIENT_PRIVILEGE:
        return None
    return DatabaseRefusedError(
        f"PostgreSQL refused this command to the user of FULFILMENT_DATABASE_URL:"
        f" {type(cause).__name__}: {cause}; run it with the owner role's URL"
        " (docs/security.md, 'Least privilege')"
    )


UNDEFINED_TABLE = "42P01"
UNDEFINED_FUNCTION = "42883"


def schema_missing(error: BaseException) -> str | None:
    """A one-line reason when ``error`` is a table or function of the schema missing, else None.

    An operator command run against a database created by hand and never migrated (or
    migrated by an older release) meets it on its first statement; the worker and the relay
    check the revision at start instead (``schema.check_schema_current``).
    """
    cause, sqlstate = _driver_error(error)
    if sqlstate not in {UNDEFINED_TABLE, UNDEFINED_FUNCTION}:
        return None
    return (
        "the database of FULFILMENT_DATABASE_URL is not migrated to this build"
        f" ({type(cause).__name__}: {cause}): run `fulfilment migrate` first"
    )


def _driver_error(error: BaseException) -> tuple[BaseException, str | None]:
    """The innermost cause of ``error`` and the first SQLSTATE on the way to it.

    SQLAlchemy raises ``DBAPIError`` from its adapted error, raised from asyncpg's.
    """
    sqlstate = None
    while True:
        sqlstate = sqlstate or getattr(error, "sqlstate", None)
        if error.__cause__ is None:
            return error, sqlstate
        error = error.__cause__
