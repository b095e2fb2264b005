"""What both roots (``main`` for the worker, ``cli`` for the tools) build from the settings.

The adapters take plain values or a small frozen options object, never :class:`Settings`; the
translation that the two roots share is written here once.
"""

from __future__ import annotations

from fulfilment.adapters.postgres.engine import DatabaseOptions
from fulfilment.settings import Settings


def database_options(settings: Settings) -> DatabaseOptions:
    """The PostgreSQL options of ``settings``: its URL, time bounds and reservation pool size."""
    return DatabaseOptions(
        url=settings.database_url.get_secret_value(),
        connect_timeout_seconds=settings.database_connect_timeout_seconds,
        statement_timeout_seconds=settings.database_statement_timeout_seconds,
        lock_timeout_seconds=settings.database_lock_timeout_seconds,
        retry_budget_seconds=settings.retry_budget_seconds,
        pool_size=settings.database_pool_size,
    )
