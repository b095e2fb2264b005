"""A multi-host ``FULFILMENT_DATABASE_URL`` against the real PostgreSQL: the engine and the
reservations' pool both skip the hosts that refuse and use the one that is read-write.

``tests/failover`` runs the same URL over a primary and its standby that change places.
"""

from __future__ import annotations

import pytest
from pydantic import SecretStr
from sqlalchemy import text
from sqlalchemy.engine import make_url

from fulfilment.adapters.postgres.engine import create_engine, create_pool
from fulfilment.entrypoints.startup import database_options
from fulfilment.settings import DatabaseSettings, Settings
from tests.e2e.harness import free_port

pytestmark = pytest.mark.postgres


def two_hosts(database_url: str) -> str:
    """``database_url`` as three ``host`` query parameters, read-write only: a closed port,
    the real server, another closed port (asyncpg alone would keep the last)."""
    url = make_url(database_url)
    real = f"{url.host}:{url.port or 5432}"
    closed, also_closed = (f"127.0.0.1:{free_port()}" for _ in range(2))
    return (
        url.set(host=None, port=None, query={}).render_as_string(hide_password=False).rstrip("/")
        + f"?host={closed}&host={real}&host={also_closed}&target_session_attrs=read-write"
    )


async def test_the_engine_and_the_pool_connect_to_the_read_write_host_of_several(database_url):
    settings = Settings(database=DatabaseSettings(url=SecretStr(two_hosts(database_url))))
    options = database_options(settings.database, settings.deadlines)
    engine = create_engine(options)
    pool = await create_pool(options)
    try:
        async with engine.connect() as connection:
            read_only = (await connection.execute(text("SHOW transaction_read_only"))).scalar()
        async with pool.acquire() as connection:
            port = await connection.fetchval("SELECT inet_server_port()")
    finally:
        await engine.dispose()
        await pool.close()
    assert read_only == "off"
    assert port == (make_url(database_url).port or 5432)
