"""The worker's probes against a real process: alive, but not ready without its database, and
ready while its database is fine, whatever the server did to its idle connections."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from fulfilment.adapters.postgres.schema import migrate
from tests.e2e.harness import WorkerProcess, free_port
from tests.support.services import throwaway_database

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.rabbitmq]


def get(port: int, path: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return int(answer.status), json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_worker_whose_database_stops_answering_is_alive_but_not_ready(
    worker_env: dict[str, str], tmp_path: Path, workers: list[WorkerProcess], clean_database: str
) -> None:
    worker = WorkerProcess(dict(worker_env), tmp_path / "worker.log")
    workers.append(worker)  # killed at the end by the fixture
    worker.start()
    assert get(worker.port, "/health/ready") == (
        200,
        {"broker": True, "consumer": True, "database": True},
    )

    name = make_url(clean_database).database
    admin(clean_database, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
    try:
        admin(
            clean_database,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = $1 AND pid <> pg_backend_pid()",
            name,
        )
        deadline = time.monotonic() + 20
        ready = get(worker.port, "/health/ready")
        while ready[0] == 200 and time.monotonic() < deadline:
            time.sleep(0.2)
            ready = get(worker.port, "/health/ready")
        live = get(worker.port, "/health/live")
    finally:
        admin(clean_database, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')

    assert ready == (503, {"broker": True, "consumer": True, "database": False}), worker.log_tail()
    assert live == (200, {"status": "ok"})
    assert worker.process is not None
    assert worker.process.poll() is None


IDLE_SESSION_TIMEOUT_SECONDS = 2


def test_readiness_stays_true_while_the_server_closes_idle_pooled_connections(
    worker_env: dict[str, str], tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    # A database of its own: the session's must keep its idle connections.
    with throwaway_database("fulfilment_idle") as url:
        migrate(url)
        name = make_url(url).database
        admin(
            url,
            f'ALTER DATABASE "{name}"'
            f" SET idle_session_timeout = '{IDLE_SESSION_TIMEOUT_SECONDS}s'",
        )
        worker = WorkerProcess(
            {**worker_env, "FULFILMENT_DATABASE_URL": url}, tmp_path / "worker.log"
        )
        workers.append(worker)
        worker.start()
        answers = []
        for _ in range(8):
            time.sleep(IDLE_SESSION_TIMEOUT_SECONDS + 1)  # every pooled connection is closed
            answers.append(get(worker.port, "/health/ready"))
        worker.stop_quietly()

    ready = (200, {"broker": True, "consumer": True, "database": True})
    failed = [answer for answer in answers if answer != ready]
    assert failed == [], f"{len(failed)} of {len(answers)} probes not ready: {failed[0]}"


def test_a_worker_that_cannot_reach_its_database_at_start_exits_3_with_one_line(
    worker_env: dict[str, str],
) -> None:
    closed = free_port()  # nothing listens there
    env = {
        **worker_env,
        "FULFILMENT_DATABASE_URL": f"postgresql+asyncpg://postgres@127.0.0.1:{closed}/none",
        "FULFILMENT_HTTP_PORT": str(free_port()),
    }
    done = subprocess.run(
        [sys.executable, "-m", "fulfilment"], env=env, capture_output=True, timeout=60, check=False
    )

    assert done.returncode == 3
    lines = [line for line in done.stderr.decode().splitlines() if "database_unreachable" in line]
    assert len(lines) == 1
    assert "Traceback" not in done.stderr.decode()


def start_refused(env: dict[str, str], event: str) -> tuple[int, list[str]]:
    """Start a worker that must refuse to start; its exit code and its log lines of ``event``."""
    done = subprocess.run(
        [sys.executable, "-m", "fulfilment"],
        env={**env, "FULFILMENT_HTTP_PORT": str(free_port())},
        capture_output=True,
        timeout=60,
        check=False,
    )
    log = done.stderr.decode()
    assert "Traceback" not in log
    return done.returncode, [json.loads(line) for line in log.splitlines() if event in line]


def test_a_worker_whose_broker_refuses_its_password_exits_4_with_one_line(
    worker_env: dict[str, str],
) -> None:
    url = urllib.parse.urlsplit(worker_env["FULFILMENT_AMQP_URL"])
    wrong = url._replace(netloc=f"{url.username}:wrong-password@{url.hostname}:{url.port}")

    code, lines = start_refused(
        {**worker_env, "FULFILMENT_AMQP_URL": wrong.geturl()}, "worker.broker_refused"
    )

    assert code == 4
    assert len(lines) == 1
    assert lines[0]["reason"].startswith(
        f"RabbitMQ at {url.scheme}://{url.username}:***@{url.hostname}:{url.port}{url.path}"
        f" refused the login of user '{url.username}': "
    )


def test_a_worker_whose_database_does_not_exist_exits_4_with_one_line(
    worker_env: dict[str, str],
) -> None:
    missing = make_url(worker_env["FULFILMENT_DATABASE_URL"]).set(database="fulfilment_missing")

    code, lines = start_refused(
        {**worker_env, "FULFILMENT_DATABASE_URL": missing.render_as_string(hide_password=False)},
        "worker.database_refused",
    )

    assert code == 4
    assert len(lines) == 1
    assert lines[0]["reason"].startswith(
        f"PostgreSQL at {missing.render_as_string(hide_password=True)} has no such database"
    )


def admin(database_url: str, sql: str, *arguments: object) -> None:
    """Run one statement on the test server's ``postgres`` database."""
    import asyncio  # noqa: PLC0415

    import asyncpg  # noqa: PLC0415

    url = make_url(database_url).set(drivername="postgresql", database="postgres")

    async def run() -> None:
        connection = await asyncpg.connect(url.render_as_string(hide_password=False))
        try:
            await connection.execute(sql, *arguments)
        finally:
            await connection.close()

    asyncio.run(run())
