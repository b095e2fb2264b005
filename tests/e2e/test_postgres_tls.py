"""TLS to PostgreSQL through the URL: a TLS-only instance of the test's own, a CA it makes.

The instance (``initdb`` under a temporary folder, a spare port, ``ssl = on``, ``pg_hba.conf``
with ``hostssl`` lines only) is started and stopped by the module's fixture; the machine's own
PostgreSQL is not touched. ``migrate``, the worker with its readiness check and one order, the
relay, ``report`` and ``outbox prune`` all connect through ``sslmode=verify-full`` and
``sslrootcert``; a wrong CA and ``sslmode=disable`` are refused in one line.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aio_pika
import asyncpg
import pytest

from tests.e2e.harness import (
    FAST_SETTINGS,
    WorkerProcess,
    free_port,
    order_event,
    publish,
    spawn,
    wait_for,
)
from tests.e2e.relay_harness import FULFILMENT, RelayProcess, bind_events_queue, take
from tests.support.certificates import make_ca, make_server_certificate
from tests.support.services import service_unavailable

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.rabbitmq]

PASSWORD = "tls-secret-never-shown"  # noqa: S105 - the instance trusts every login
"""In every URL of the tests, so that each message can be checked for leaving it out."""


@dataclass(frozen=True)
class TlsPostgres:
    """A running TLS-only instance: where it listens and the CA files the tests trust."""

    port: int
    ca_file: Path
    wrong_ca_file: Path

    def url(self, query: str, *, database: str = "fulfilment") -> str:
        """A ``postgresql://`` URL of ``database`` with a password and the query ``query``."""
        return f"postgresql://postgres:{PASSWORD}@127.0.0.1:{self.port}/{database}?{query}"

    def verified_url(self, *, database: str = "fulfilment") -> str:
        return self.url(f"sslmode=verify-full&sslrootcert={self.ca_file}", database=database)


def _server_user() -> str | None:
    """The user the instance runs as: ``initdb`` and ``postgres`` refuse root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    pytest.fail("running as root and no unprivileged user (postgres, nobody) to run initdb as")


@pytest.fixture(scope="module")
def tls_postgres() -> Iterator[TlsPostgres]:
    """Start the TLS-only instance; stop it and remove its folder at the end of the module."""
    missing = [tool for tool in ("initdb", "pg_ctl", "openssl") if shutil.which(tool) is None]
    if missing:
        service_unavailable(
            "A TLS PostgreSQL of the test's own", FileNotFoundError(", ".join(missing))
        )
    user = _server_user()
    folder = Path(tempfile.mkdtemp(prefix="fulfilment-pg-tls-"))
    data = folder / "data"
    port = free_port()
    started = False
    try:
        make_ca(folder, "ca")
        make_ca(folder, "wrong-ca")
        make_server_certificate(folder, "ca")
        (folder / "server.key").chmod(0o600)  # the server refuses a key others can read
        if user is not None:
            shutil.chown(folder, user)
            for name in ("server.crt", "server.key"):
                shutil.chown(folder / name, user)

        def as_server(*command: str) -> None:
            subprocess.run(command, check=True, capture_output=True, timeout=120, user=user)

        as_server("initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync")
        with (data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"port = {port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{folder}'\nssl = on\n"
                f"ssl_cert_file = '{folder / 'server.crt'}'\n"
                f"ssl_key_file = '{folder / 'server.key'}'\n"
                "fsync = off\n"
            )
        # TLS connections only: hostssl, no host line; the local socket serves pg_ctl alone.
        (data / "pg_hba.conf").write_text(
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\n"
        )
        as_server("pg_ctl", "-D", str(data), "-l", str(folder / "server.log"), "-w", "start")
        started = True
        yield TlsPostgres(port, folder / "ca.crt", folder / "wrong-ca.crt")
    finally:
        if started:
            as_server("pg_ctl", "-D", str(data), "-m", "fast", "-w", "stop")
        shutil.rmtree(folder, ignore_errors=True)


def fulfilment(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``fulfilment <args>`` in a child process with ``env``; its output as text."""
    return subprocess.run(
        [FULFILMENT, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def service_env(database_url: str, amqp_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FULFILMENT_", "PGSSL"))}
    env.update(FAST_SETTINGS)
    env["FULFILMENT_DATABASE_URL"] = database_url
    env["FULFILMENT_AMQP_URL"] = amqp_url
    return env


async def connected_over_tls(dsn: str, application: str) -> list[bool]:
    """``pg_stat_ssl.ssl`` of every session of ``application`` (the asking one excluded)."""
    connection = await asyncpg.connect(dsn)
    try:
        rows = await connection.fetch(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)"
            " WHERE a.application_name = $1 AND a.pid <> pg_backend_pid()",
            application,
        )
        return [row["ssl"] for row in rows]
    finally:
        await connection.close()


async def test_migrate_the_worker_the_relay_and_the_tools_run_through_verify_full(
    tls_postgres: TlsPostgres,
    amqp_url: str,
    workers: list[WorkerProcess],
    broker: aio_pika.abc.AbstractRobustConnection,
    tmp_path: Path,
) -> None:
    url = tls_postgres.verified_url(database=f"fulfilment_{uuid.uuid4().hex[:8]}")
    env = service_env(url, amqp_url)

    migrated = await asyncio.to_thread(fulfilment, env, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    db = await asyncpg.connect(url)  # asyncpg reads sslmode and sslrootcert from the URL
    try:
        assert await db.fetchval("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        await db.execute("INSERT INTO stock_levels (sku, on_hand) VALUES ('85123A', 10)")

        events = await bind_events_queue(broker, "stock.reserved")
        worker = spawn(workers, env, tmp_path)  # waits for /health/ready, which pings the database
        relay = RelayProcess(dict(env), tmp_path / "relay.log")
        relay.start()
        try:
            body, event_id = order_event([("85123A", 4)])
            await publish(broker, body, message_id=event_id)

            [reserved] = await take(events, 1)
            assert json.loads(reserved.body)["causation_id"] == event_id
            assert await db.fetchval("SELECT reserved FROM stock_levels WHERE sku = '85123A'") == 4

            async def published() -> bool:
                return bool(
                    await db.fetchval("SELECT published_at IS NOT NULL FROM outbox WHERE id = 1")
                )

            await wait_for(published, what="the relay's mark after the confirm")
            assert worker.ready()
            sessions = await connected_over_tls(url, "fulfilment")
            assert sessions
            assert all(sessions)
            assert await connected_over_tls(url, "fulfilment-relay") == [True]
        finally:
            relay.stop_quietly()
    finally:
        await db.close()

    report = await asyncio.to_thread(fulfilment, env, "report", "--json")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["invariants"]["ok"] is True
    pruned = await asyncio.to_thread(fulfilment, env, "outbox", "prune")
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.startswith("outbox prune: 0 published rows")


async def test_a_certificate_from_another_ca_stops_migrate_and_the_worker_in_one_line(
    tls_postgres: TlsPostgres, amqp_url: str, tmp_path: Path
) -> None:
    url = tls_postgres.url(f"sslmode=verify-full&sslrootcert={tls_postgres.wrong_ca_file}")
    env = service_env(url, amqp_url)

    migrated = await asyncio.to_thread(fulfilment, env, "migrate")
    assert migrated.returncode == 4  # as for a refused user: retrying cannot mend it
    [line] = migrated.stderr.splitlines()
    assert "TLS certificate did not verify" in line
    assert f"postgres:***@127.0.0.1:{tls_postgres.port}/fulfilment" in line
    assert PASSWORD not in line

    worker = WorkerProcess(dict(env), tmp_path / "worker.log")
    worker.start(wait_ready=False)
    assert worker.process is not None
    assert await asyncio.to_thread(worker.process.wait, 60) == 4
    [refusal] = [line for line in worker.log_lines() if line.get("level") == "error"]
    assert refusal["event"] == "worker.database_refused"
    assert "TLS certificate did not verify" in refusal["reason"]
    assert PASSWORD not in worker.log_path.read_text()


async def test_a_url_without_tls_is_refused_by_a_hostssl_only_server(
    tls_postgres: TlsPostgres, amqp_url: str
) -> None:
    env = service_env(tls_postgres.url("sslmode=disable"), amqp_url)

    migrated = await asyncio.to_thread(fulfilment, env, "migrate")

    assert migrated.returncode == 4
    [line] = migrated.stderr.splitlines()
    assert "refused user 'postgres'" in line
    assert "no encryption" in line  # the server's pg_hba.conf found no entry for plain TCP
    assert PASSWORD not in line
