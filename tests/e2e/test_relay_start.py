"""The relay's start against the real RabbitMQ and PostgreSQL: it refuses, with one log line and
the worker's exit code, what waiting cannot mend (a database behind its migrations, a refused
user, virtual host or database, a database URL whose TLS file or setting cannot work, a taken
HTTP port), waits for a service that does not answer, and after a healthy session meets the
next outage with its first back-off, not its longest."""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import pytest
from sqlalchemy.engine import make_url

from fulfilment.pump.leader import RECONNECT_INITIAL_SECONDS
from tests.e2e.harness import free_port, wait_for
from tests.e2e.relay_harness import (
    FULFILMENT,
    RelayProcess,
    TcpGate,
    bind_events_queue,
    insert_outbox,
    lifecycle_rows,
    spawn_relay,
    take,
)
from tests.support.services import throwaway_database

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.rabbitmq]

JITTER_MAX_SECONDS = 1.0
"""tenacity's ``wait_exponential_jitter`` adds up to 1 s to each wait by default."""


def start_refused(
    env: dict[str, str], event: str, *, port: int | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """Run a relay that must refuse to start (on ``port``, else a free one); its exit code and
    its log lines of ``event``."""
    done = subprocess.run(
        [FULFILMENT, "relay"],
        env={**env, "FULFILMENT_RELAY_HTTP_PORT": str(port or free_port())},
        capture_output=True,
        timeout=60,
        check=False,
    )
    log = done.stderr.decode() + done.stdout.decode()
    assert "Traceback" not in log
    assert "relay.standing_by" not in log  # refused before any session
    return done.returncode, [json.loads(line) for line in log.splitlines() if event in line]


def test_a_relay_on_a_database_that_is_not_migrated_exits_1_with_one_line(
    relay_env: dict[str, str],
) -> None:
    with throwaway_database("fulfilment_unmigrated") as url:
        code, lines = start_refused(
            {**relay_env, "FULFILMENT_DATABASE_URL": url}, "relay.schema_not_current"
        )

    assert code == 1
    assert len(lines) == 1
    assert lines[0]["reason"].startswith("the database is at revision none, this build needs ")


def test_a_relay_whose_broker_refuses_its_password_exits_4_with_one_line(
    relay_env: dict[str, str],
) -> None:
    url = urllib.parse.urlsplit(relay_env["FULFILMENT_AMQP_URL"])
    wrong = url._replace(netloc=f"{url.username}:wrong-password@{url.hostname}:{url.port}")

    code, lines = start_refused(
        {**relay_env, "FULFILMENT_AMQP_URL": wrong.geturl()}, "relay.broker_refused"
    )

    assert code == 4
    assert len(lines) == 1
    assert lines[0]["reason"].startswith(
        f"RabbitMQ at {url.scheme}://{url.username}:***@{url.hostname}:{url.port}{url.path}"
        f" refused the login of user '{url.username}': "
    )


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"database": "fulfilment_missing"}, "has no such database"),
        ({"username": "fulfilment_no_such_role"}, "refused user 'fulfilment_no_such_role'"),
    ],
    ids=["missing database", "unknown user"],
)
def test_a_relay_whose_database_refuses_it_exits_4_with_one_line(
    relay_env: dict[str, str], change: dict[str, str], said: str
) -> None:
    refused = make_url(relay_env["FULFILMENT_DATABASE_URL"]).set(**change)

    code, lines = start_refused(
        {**relay_env, "FULFILMENT_DATABASE_URL": refused.render_as_string(hide_password=False)},
        "relay.database_refused",
    )

    assert code == 4
    assert len(lines) == 1
    assert lines[0]["reason"].startswith(
        f"PostgreSQL at {refused.render_as_string(hide_password=True)} {said}"
    )


@pytest.mark.parametrize(
    ("query", "said"),
    [
        (
            "sslmode=verify-full&sslrootcert=/nonexistent/ca.crt",
            (
                ": a TLS file the URL names cannot be read (sslrootcert=/nonexistent/ca.crt):"
                " FileNotFoundError: "
            ),
        ),
        (
            "timezone=Nowhere",
            (
                " refused the setting timezone= of FULFILMENT_DATABASE_URL (a query parameter"
                " that is not a connection parameter reaches the server as a setting):"
                " InvalidParameterValueError: "
            ),
        ),
    ],
    ids=["unreadable CA file", "refused setting"],
)
def test_a_relay_whose_database_url_cannot_work_exits_4_without_retrying(
    relay_env: dict[str, str], query: str, said: str
) -> None:
    url = f"{relay_env['FULFILMENT_DATABASE_URL']}?{query}"

    code, lines = start_refused(
        {**relay_env, "FULFILMENT_DATABASE_URL": url}, "relay.database_refused"
    )

    assert code == 4
    assert len(lines) == 1
    assert lines[0]["reason"].startswith(
        f"PostgreSQL at {make_url(url).render_as_string(hide_password=True)}{said}"
    )


def test_a_relay_whose_http_port_is_taken_exits_1_naming_the_port_variable(
    relay_env: dict[str, str],
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        code, lines = start_refused(
            {**relay_env, "FULFILMENT_HTTP_HOST": "127.0.0.1"},
            "relay.http_listen_failed",
            port=port,
        )

    assert code == 1
    assert [line["reason"] for line in lines] == [
        (
            f"the HTTP server of the relay cannot listen on 127.0.0.1:{port}: another process holds"
            " the port; set FULFILMENT_RELAY_HTTP_PORT to a free one: [Errno 98] Address"
            " already in use"
        )
    ]


async def test_a_relay_waits_for_its_database_and_starts_its_back_off_again_after_a_session(
    relays: list[RelayProcess],
    relay_env: dict[str, str],
    tmp_path: Path,
    broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
) -> None:
    target = make_url(relay_env["FULFILMENT_DATABASE_URL"])
    gate = TcpGate(target.host or "127.0.0.1", target.port or 5432)
    through_gate = target.set(port=gate.port).render_as_string(hide_password=False)
    queue = await bind_events_queue(broker)
    relay = spawn_relay(
        relays, {**relay_env, "FULFILMENT_DATABASE_URL": through_gate}, tmp_path, wait_ready=False
    )

    def lines(event: str) -> list[dict[str, Any]]:
        return [line for line in relay.log_lines() if line.get("event") == event]

    def attempts(event: str, at_least: int) -> Any:
        async def reached() -> bool:
            return any(line["attempt"] >= at_least for line in lines(event))

        return reached

    try:
        # Down at start: the relay waits, with a growing back-off, and does not exit.
        await wait_for(attempts("relay.database_unreachable", 3), what="three tries at start")
        assert relay.process is not None
        assert relay.process.poll() is None
        await gate.open()
        await wait_for(lambda: _role(relay, "active"), what="the relay to take the lock")
        events = await insert_outbox(db, lifecycle_rows(2))
        assert len(await take(queue, len(events))) == len(events)

        # A first outage after that healthy session: the back-off grows again.
        await gate.close()
        await wait_for(attempts("relay.reconnecting", 4), what="four reconnect attempts")
        await gate.open()

        async def active_again() -> bool:
            return len(lines("relay.active")) == 2

        await wait_for(active_again, what="the relay to take the lock again")

        # The next outage is met with the first wait, not with the one the last outage reached.
        await gate.close()

        async def retried_after_second_loss() -> bool:
            return len(lines("relay.connection_lost")) == 2 and _after_last_loss(relay) != []

        await wait_for(retried_after_second_loss, what="a reconnect attempt after the second loss")
    finally:
        await gate.close()

    [first, *_] = _after_last_loss(relay)
    assert first["attempt"] == 1
    assert first["wait_seconds"] <= RECONNECT_INITIAL_SECONDS + JITTER_MAX_SECONDS
    assert [line["wait_seconds"] for line in lines("relay.connection_lost")] == [
        RECONNECT_INITIAL_SECONDS
    ] * 2


async def _role(relay: RelayProcess, role: str) -> bool:
    return relay.readiness().get("role") == role


def _after_last_loss(relay: RelayProcess) -> list[dict[str, Any]]:
    """The ``relay.reconnecting`` lines after the last ``relay.connection_lost``."""
    log = relay.log_lines()
    last = max(i for i, line in enumerate(log) if line.get("event") == "relay.connection_lost")
    return [line for line in log[last:] if line.get("event") == "relay.reconnecting"]
