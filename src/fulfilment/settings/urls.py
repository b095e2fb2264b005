"""Checks of the service's URLs, before any connection: the settings' validators call them.

Each raises :class:`ValueError` with a message that the settings prefix with the variable's
name (``FULFILMENT_DATABASE_URL: ...``); none shows a password. The files a URL names (CA
files, client certificates) are read when connecting, not here: the settings are also checked
where those files are not mounted (the deploy files' tests).
"""

from __future__ import annotations

import base64
import binascii
import difflib
import urllib.parse
from typing import Final

from fulfilment.asyncpg_url import ASYNCPG_URL_PARAMETERS

SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
"""libpq's ``sslmode`` values (PostgreSQL manual, "SSL Support"), with libpq's meanings."""


def check_database_tls(url: str) -> None:
    """Refuse query parameters of a database URL that no connection could use.

    Raises:
        ValueError: a near miss of a parameter asyncpg reads (``sslmod``, ``sslrootcrt``,
            ``SSLMODE``; ``asyncpg_url.ASYNCPG_URL_PARAMETERS``), which asyncpg would send to the
            server as a setting (no setting in PostgreSQL 15's ``pg_settings`` is that near
            one); an ``sslmode`` outside :data:`SSL_MODES`; or ``ssl=`` (asyncpg's keyword,
            which a URL would send to the server as a setting, failing every pooled connection
            with "parameter ssl cannot be changed now"). The files ``sslrootcert`` and the
            others name are read when connecting, not here: the settings are also checked
            where those files are not mounted (the deploy files' tests).
    """
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    for name in query:
        if name in ASYNCPG_URL_PARAMETERS or "." in name:  # a dotted name: an extension's
            continue
        meant = difflib.get_close_matches(name.lower(), ASYNCPG_URL_PARAMETERS, n=1, cutoff=0.8)
        if meant:
            msg = (
                f"has {name}=, which is no connection parameter and would reach the server as"
                f" a setting: did you mean {meant[0]}=?"
            )
            raise ValueError(msg)
    if "ssl" in query:
        msg = "takes TLS as libpq does: use sslmode=verify-full (or require), not ssl="
        raise ValueError(msg)
    for mode in query.get("sslmode", []):
        if mode not in SSL_MODES:
            msg = f"has sslmode={mode!r}; it must be one of {', '.join(SSL_MODES)}"
            raise ValueError(msg)


AMQP_TLS_PARAMETERS = ("cafile", "capath", "cadata", "certfile", "keyfile", "no_verify_ssl")
"""TLS query parameters of an ``amqps://`` URL, as aiormq reads them for every connection
(aiormq's README, "Full SSL/TLS support with url query parameters"): the CA file, folder or
base64 data the server's certificate is checked against (the system's CAs without them); a
client certificate and its key; and ``no_verify_ssl=1``, which turns the check off."""

AMQP_FOREIGN_TLS_PARAMETERS = {
    "ca_certs": "cafile",
    "cacertfile": "cafile",
    "cacert": "cafile",
    "sslrootcert": "cafile",
    "sslcert": "certfile",
    "sslkey": "keyfile",
    "cert_reqs": "no_verify_ssl",
    "verify": "no_verify_ssl",
    "check_hostname": "no_verify_ssl",
    "sslmode": "amqps://",
    "ssl": "amqps://",
    "tls": "amqps://",
    "ssl_version": "amqps://",
    "server_name_indication": "amqps://",
}
"""TLS parameters of other clients (pika, the Erlang client, libpq, older aio-pika examples)
that aiormq ignores without a word, so that a URL with them would connect without the check
its author asked for; each with what this client reads instead."""


MAX_PORT: Final = 65535


def check_ports(url: str) -> None:
    """Refuse a URL whose host, or one of whose hosts, names a port that is no TCP port.

    The client libraries would raise it as a bare ``ValueError`` or ``OverflowError`` at the
    first connection (``port can't be converted to integer``), a traceback instead of the
    variable's name. A database URL may list several hosts (``h1:5432,h2:5433``, libpq's
    form, which asyncpg reads); each is checked. An IPv6 literal keeps its brackets.

    Raises:
        ValueError: a port that is not a whole number from 1 to 65535; the password is not shown.
    """
    hosts = urllib.parse.urlsplit(url).netloc.rpartition("@")[2]
    for host in hosts.split(","):
        after_address = host.rpartition("]")[2] if host.startswith("[") else host
        text = after_address.rpartition(":")[2] if ":" in after_address else ""
        if text and not (text.isdigit() and 1 <= int(text) <= MAX_PORT):
            msg = f"names the port {text!r}: a port is a whole number from 1 to {MAX_PORT}"
            raise ValueError(msg)


def check_broker_tls(url: str) -> None:
    """Refuse TLS query parameters of a broker URL that aiormq would ignore or misread.

    Raises:
        ValueError: a parameter of :data:`AMQP_FOREIGN_TLS_PARAMETERS`; a parameter of
            :data:`AMQP_TLS_PARAMETERS` on a plain ``amqp://`` URL (it would connect without
            TLS); ``no_verify_ssl`` other than 0 or 1 (aiormq turns the check off for every
            value but 0, ``false`` included); ``keyfile`` without ``certfile`` (ignored);
            ``cadata`` that is not base64. The files are read when connecting, not here (as
            for the database URL).
    """
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    for name, instead in AMQP_FOREIGN_TLS_PARAMETERS.items():
        if name in query:
            msg = (
                f"has {name}=, which the AMQP client does not read: TLS is asked for with"
                f" amqps:// and set with {', '.join(AMQP_TLS_PARAMETERS)}"
                f" (use {instead} here)"
            )
            raise ValueError(msg)
    given = [name for name in AMQP_TLS_PARAMETERS if name in query]
    if given and parts.scheme != "amqps":
        msg = f"has {given[0]}= but amqp:// connects without TLS: use amqps://"
        raise ValueError(msg)
    for value in query.get("no_verify_ssl", []):
        if value not in {"0", "1"}:
            msg = (
                f"has no_verify_ssl={value!r}; it must be 0 (check the server's certificate"
                " and host name, the default) or 1 (do not)"
            )
            raise ValueError(msg)
    if "keyfile" in query and "certfile" not in query:
        msg = "has keyfile= without certfile=: the client certificate needs both"
        raise ValueError(msg)
    for value in query.get("cadata", []):
        try:
            base64.b64decode(value, validate=True)
        except binascii.Error:
            msg = "has cadata= that is not base64 (of the CA's DER or PEM bytes)"
            raise ValueError(msg) from None


DATABASE_NAME_PARAMETERS = ("dbname", "database")
"""Query parameters that name the database instead of the URL's path (libpq's, asyncpg's)."""


def check_database_name(url: str) -> None:
    """Refuse a database URL that names no database.

    Without one, asyncpg (like libpq) connects to the database named as the user, or as
    ``PGDATABASE`` says: with the default user ``postgres``, the server's maintenance database,
    where the migrations would create the service's tables beside whatever else lives there.
    The name is the URL's path (``.../fulfilment``) or its ``dbname=`` parameter.

    Raises:
        ValueError: neither gives a name.
    """
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parts.query)
    if parts.path.strip("/") or any(query.get(name) for name in DATABASE_NAME_PARAMETERS):
        return
    msg = (
        "names no database (it would connect to the one named as its user): put the"
        " database's name after the host, e.g. postgresql://user@host:5432/fulfilment"
    )
    raise ValueError(msg)


DATABASE_SCHEMES = ("postgresql+asyncpg://", "postgresql://", "postgres://")
"""The schemes a database URL may have; each is run with the asyncpg driver."""


def database_url(url: str) -> str:
    """``url`` checked, in the form SQLAlchemy runs with asyncpg (``postgresql+asyncpg://``).

    Raises:
        ValueError: another scheme; a port that is no port (:func:`check_ports`); a TLS
            parameter no connection could use (:func:`check_database_tls`); no database name
            (:func:`check_database_name`).
    """
    for prefix in DATABASE_SCHEMES:
        if url.startswith(prefix):
            check_ports(url)
            check_database_tls(url)
            check_database_name(url)
            return "postgresql+asyncpg://" + url.removeprefix(prefix)
    msg = "must start with postgresql:// or postgresql+asyncpg://"
    raise ValueError(msg)


def check_broker_url(url: str) -> None:
    """Refuse a broker URL that is not ``amqp://`` or ``amqps://`` or that the client misreads.

    Raises:
        ValueError: another scheme; a port that is no port (:func:`check_ports`); a TLS
            parameter the client ignores or misreads (:func:`check_broker_tls`).
    """
    if not url.startswith(("amqp://", "amqps://")):
        msg = "must start with amqp:// or amqps://"
        raise ValueError(msg)
    check_ports(url)
    check_broker_tls(url)


def check_warehouse_url(url: str) -> None:
    """Refuse a warehouse system's API base that is not an ``http(s)://`` URL with a host.

    Raises:
        ValueError: another scheme or no host; a query or fragment (the URL is a base that
            paths are added to); a port that is no port (:func:`check_ports`).
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        msg = "must be an http:// or https:// URL with a host, e.g. https://wms.example/api/v1"
        raise ValueError(msg)
    if parts.query or parts.fragment:
        msg = "is the API's base: no ?query or #fragment"
        raise ValueError(msg)
    check_ports(url)
