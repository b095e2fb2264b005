"""Errors of the PostgreSQL adapter that callers can act on."""

from __future__ import annotations

import ssl
from collections.abc import Iterable

from sqlalchemy.engine import make_url

SKUS_SHOWN = 10
"""SKUs named in the message; ``skus`` holds them all."""


class StockBelowReservedError(ValueError):
    """A new ``on_hand`` would fall below what is already reserved for some SKUs.

    Raised by ``PostgresWarehouse.put_stock`` (and the in-memory fake) before any level is
    changed; the rule is the ``0 <= reserved <= on_hand`` invariant of ``stock_levels``.
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


def connection_failure(url: str, error: BaseException) -> DatabaseUnavailableError:
    """What a failed connection to ``url`` means, in one line without the password.

    ``error`` is asyncpg's, an ``OSError`` or ``TimeoutError``, or SQLAlchemy's wrapper of
    one; the line names the driver's own error (innermost cause). A :class:`DatabaseRefusedError`
    when the server refused the user (SQLSTATE class 28, ``InvalidPasswordError``,
    ``InvalidAuthorizationSpecificationError``; or 42501; also a ``pg_hba.conf`` that takes
    only TLS connections, ``hostssl``, refusing ``sslmode=disable``), has no such database
    (3D000), or presented a certificate that did not verify against the URL's ``sslrootcert``
    (``ssl.SSLCertVerificationError``, a wrong CA or host name); otherwise a
    :class:`DatabaseUnavailableError`.
    """
    parsed = make_url(url)
    where = parsed.render_as_string(hide_password=True)
    cause, sqlstate = _driver_error(error)
    said = f"{type(cause).__name__}: {cause}"
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


INSUFFICIENT_PRIVILEGE = "42501"
"""``insufficient_privilege``: the user may not do this to this object."""


def privilege_refusal(error: BaseException) -> DatabaseRefusedError | None:
    """A one-line refusal when ``error`` is PostgreSQL's ``insufficient_privilege``, else None.

    An operator command run with the runtime role's URL (README, "Least privilege") meets it
    on the first statement the role may not run: the line names the statement's object and
    says which role the command needs.
    """
    cause, sqlstate = _driver_error(error)
    if sqlstate != INSUFFICIENT_PRIVILEGE:
        return None
    return DatabaseRefusedError(
        f"PostgreSQL refused this command to the user of FULFILMENT_DATABASE_URL:"
        f" {type(cause).__name__}: {cause}; run it with the owner role's URL (README,"
        " 'Least privilege')"
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
