"""What asyncpg reads of a PostgreSQL URL: a leaf, for the settings and the PostgreSQL adapter.

The settings refuse a near miss of these parameters before any connection
(``settings.urls.check_database_tls``), and the adapter names them in the error of a server that
refused one (``adapters.postgres.errors``); neither imports the other.
"""

from __future__ import annotations

ASYNCPG_URL_PARAMETERS = frozenset(
    {
        "host", "port", "dbname", "database", "user", "password", "passfile", "service",
        "sslmode", "sslcert", "sslkey", "sslrootcert", "sslcrl", "sslpassword",
        "sslnegotiation", "ssl_min_protocol_version", "ssl_max_protocol_version",
        "target_session_attrs", "krbsrvname", "gsslib",
    }
)  # fmt: skip
"""The libpq query parameters asyncpg 0.32 reads from a URL (``connect_utils``); it sends
every other query parameter to the server as a setting (``server_settings``)."""
