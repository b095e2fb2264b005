"""Alembic environment: runs the migrations over SQLAlchemy's asyncpg engine.

The URL is the configuration's ``sqlalchemy.url`` when set (``schema.migrate`` sets it), else
``FULFILMENT_DATABASE_URL`` through the service's settings, so the command line and the service
migrate the same database.
"""

from __future__ import annotations

import asyncio
from logging.config import fileConfig

from alembic import context
from sqlalchemy import pool, text
from sqlalchemy.engine import Connection, make_url

from fulfilment.adapters.postgres.engine import async_engine
from fulfilment.adapters.postgres.privileges import apply_runtime_grants
from fulfilment.adapters.postgres.schema import GRANT_SUMMARY_ATTRIBUTE, RUNTIME_ROLE_ATTRIBUTE
from fulfilment.adapters.postgres.tables import metadata

config = context.config

MIGRATION_LOCK_KEY = 7_305_162_841
"""Advisory lock key held while migrating: replicas that migrate at once run one at a time, and
the later ones find the schema already at head."""

# Only the `alembic` command line has a file; `schema.migrate` must not reconfigure the
# service's logging.
if config.config_file_name is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def database_url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        from fulfilment.settings import load_settings  # noqa: PLC0415 - only when unset

        url = load_settings().database.url.get_secret_value()
    # Accept plain postgresql:// like the settings do: the environment is async-only.
    parsed = make_url(url)
    if parsed.drivername in {"postgresql", "postgres"}:
        parsed = parsed.set(drivername="postgresql+asyncpg")
    return parsed.render_as_string(hide_password=False)


def run_migrations_offline() -> None:
    context.configure(
        url=database_url(),
        target_metadata=metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    # One transaction for the whole upgrade (PostgreSQL has transactional DDL): a failed
    # migration leaves the schema and alembic_version as they were.
    context.configure(
        connection=connection, target_metadata=metadata, transaction_per_migration=False
    )
    with context.begin_transaction():
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        context.run_migrations()
        # The runtime role's privileges (fulfilment migrate with FULFILMENT_DATABASE_RUNTIME_ROLE),
        # in the same transaction and under the same lock: concurrent GRANTs on one object fail
        # with "tuple concurrently updated", and a refused grant undoes the upgrade with it.
        role = config.attributes.get(RUNTIME_ROLE_ATTRIBUTE)
        if role:
            config.attributes[GRANT_SUMMARY_ATTRIBUTE] = apply_runtime_grants(connection, role)


async def run_async_migrations() -> None:
    # NullPool: a migration is a one-off; nothing should outlive it. async_engine connects as
    # the service does, TLS parameters of the URL (sslmode, sslrootcert...) included.
    engine = async_engine(database_url(), connect_args={}, poolclass=pool.NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(do_run_migrations)
    finally:
        await engine.dispose()


def run_migrations_online() -> None:
    asyncio.run(run_async_migrations())


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
