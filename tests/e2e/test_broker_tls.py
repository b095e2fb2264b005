"""TLS to RabbitMQ through the URL, on the session's private TLS-only node, as the shipped user.

The node (``private_broker`` in ``tests/conftest.py``) listens with TLS only, its certificate
names ``localhost`` alone, and it loaded ``deploy/rabbitmq/definitions.json`` at boot. The
worker (its topology declaration, FastStream's connection, the queue monitor and the readiness
check), the relay, and ``fulfilment dlq list`` all connect through ``amqps://`` with the CA in
``cafile``, as the service's own user ``fulfilment``, which may use only the service's names;
an order goes in and its ``stock.reserved`` comes out. A CA that did not sign the certificate,
and a host name it does not name, stop each of them in one line (exit 4).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from pathlib import Path

import aio_pika
import asyncpg
import pytest

from fulfilment.contracts.topology import EVENTS_EXCHANGE, ORDER_PLACED_DEAD_LETTER_QUEUE
from tests.e2e.harness import (
    FAST_SETTINGS,
    WorkerProcess,
    order_event,
    publish,
    queue_depth,
    spawn,
    wait_for,
)
from tests.e2e.relay_harness import FULFILMENT, RelayProcess, take
from tests.support.private_broker import PrivateBroker

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.rabbitmq]

USER = "fulfilment"
PASSWORD = "fulfilment"  # noqa: S105 - the local stack's, public (docker-compose.yml)


def fulfilment(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``fulfilment <args>`` in a child process with ``env``; its output as text."""
    return subprocess.run(
        [FULFILMENT, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def service_env(database_url: str, amqp_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FULFILMENT_")}
    env.update(FAST_SETTINGS)
    env["FULFILMENT_DATABASE_URL"] = database_url
    env["FULFILMENT_AMQP_URL"] = amqp_url
    # One node: every quorum queue has one member (RabbitMQ caps a larger initial group size).
    env["FULFILMENT_QUORUM_INITIAL_GROUP_SIZE"] = "1"
    return env


async def test_the_worker_the_relay_and_the_tools_run_through_amqps_as_the_services_user(
    private_broker: PrivateBroker,
    clean_database: str,
    db: asyncpg.Connection,
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    url = private_broker.url(USER, PASSWORD)
    env = service_env(clean_database, url)
    await db.execute("INSERT INTO stock_levels (sku, on_hand) VALUES ('85123A', 10)")
    broker = await aio_pika.connect(url)  # aiormq reads cafile from the URL
    try:
        channel = await broker.channel()
        events_exchange = await channel.declare_exchange(
            EVENTS_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True
        )
        # A name of the service's own: the user may declare fulfilment.* only.
        events = await channel.declare_queue(
            f"fulfilment.test-events-{uuid.uuid4().hex[:8]}", exclusive=True
        )
        await events.bind(events_exchange, "stock.reserved")

        worker = spawn(workers, env, tmp_path)  # waits for /health/ready: broker ping included
        relay = RelayProcess(dict(env), tmp_path / "relay.log")
        relay.start()
        try:
            body, event_id = order_event([("85123A", 4)])
            await publish(broker, body, message_id=event_id)
            # A payload that can never succeed: dead-lettered on its first delivery.
            await publish(broker, b'{"version": 2}', message_id=str(uuid.uuid4()))

            [reserved] = await take(events, 1)
            assert json.loads(reserved.body)["causation_id"] == event_id
            assert await db.fetchval("SELECT reserved FROM stock_levels WHERE sku = '85123A'") == 4

            async def published() -> bool:
                # By event id: the session's database held other tests' outbox rows before.
                return bool(
                    await db.fetchval(
                        "SELECT published_at IS NOT NULL FROM outbox WHERE event_id = $1",
                        uuid.UUID(reserved.message_id),
                    )
                )

            await wait_for(published, what="the relay's mark after the confirm")

            async def dead_lettered() -> bool:
                return await queue_depth(broker, ORDER_PLACED_DEAD_LETTER_QUEUE) == 1

            await wait_for(dead_lettered, what="the invalid payload in the DLQ")
            assert worker.ready()
            assert relay.readiness()["broker"] is True
            listed = private_broker.ctl("-q", "list_connections", "user", "ssl", "--formatter=json")
            connections = json.loads(listed)
            assert connections
            assert {(c["user"], c["ssl"]) for c in connections} == {(USER, True)}
        finally:
            relay.stop_quietly()
    finally:
        await broker.close()

    dlq = await asyncio.to_thread(fulfilment, env, "dlq", "list", "--json")
    assert dlq.returncode == 0, dlq.stderr
    [group] = [g for g in json.loads(dlq.stdout) if g["queue"] == ORDER_PLACED_DEAD_LETTER_QUEUE]
    assert group["count"] == 1


async def test_a_certificate_from_another_ca_stops_the_worker_the_relay_and_the_tools_in_one_line(
    private_broker: PrivateBroker, clean_database: str, tmp_path: Path
) -> None:
    url = private_broker.url(USER, PASSWORD, ca_file=private_broker.wrong_ca_file)
    env = service_env(clean_database, url)

    listed = await asyncio.to_thread(fulfilment, env, "dlq", "list")
    assert listed.returncode == 4  # as for a refused login: retrying cannot mend it
    [line] = listed.stderr.splitlines()
    assert line.startswith(
        f"fulfilment: RabbitMQ at amqps://{USER}:***@localhost:{private_broker.port}/?cafile="
    )
    assert "the server's TLS certificate did not verify (the URL's cafile CA and host name)" in line
    assert "self-signed certificate in certificate chain" in line

    for process, event in (
        (WorkerProcess(dict(env), tmp_path / "worker.log"), "worker.broker_refused"),
        (RelayProcess(dict(env), tmp_path / "relay.log"), "relay.broker_refused"),
    ):
        process.start(wait_ready=False)
        assert process.process is not None
        assert await asyncio.to_thread(process.process.wait, 60) == 4
        [refusal] = [line for line in process.log_lines() if line.get("event") == event]
        assert refusal["level"] == "error"
        assert "TLS certificate did not verify" in refusal["reason"]
        assert f":{PASSWORD}@" not in process.log_path.read_text()


async def test_a_host_name_the_certificate_does_not_name_is_refused(
    private_broker: PrivateBroker, clean_database: str
) -> None:
    # The right CA, but the certificate names localhost only.
    env = service_env(clean_database, private_broker.url(USER, PASSWORD, host="127.0.0.1"))

    listed = await asyncio.to_thread(fulfilment, env, "dlq", "list")

    assert listed.returncode == 4
    [line] = listed.stderr.splitlines()
    assert "the server's TLS certificate did not verify" in line
    assert "IP address mismatch, certificate is not valid for '127.0.0.1'" in line


async def test_a_tls_parameter_the_client_would_ignore_stops_the_tools_naming_the_variable(
    private_broker: PrivateBroker, clean_database: str
) -> None:
    url = private_broker.url(USER, PASSWORD).replace("cafile=", "ca_certs=")
    env = service_env(clean_database, url)

    listed = await asyncio.to_thread(fulfilment, env, "dlq", "list")

    assert listed.returncode == 2
    [line] = listed.stderr.splitlines()
    assert line.startswith(
        "fulfilment: invalid settings: FULFILMENT_AMQP_URL: has ca_certs=, which the AMQP client"
        " does not read"
    )
    assert PASSWORD not in line.split("FULFILMENT_AMQP_URL")[1]


async def test_a_user_without_the_services_permissions_stops_the_worker_and_the_tools_in_one_line(
    private_broker: PrivateBroker, clean_database: str, tmp_path: Path
) -> None:
    # The monitoring user of the shipped definitions may declare nothing and publish nothing.
    env = service_env(
        clean_database, private_broker.url("fulfilment-monitoring", "fulfilment-monitoring")
    )
    orders = Path(__file__).parents[2] / "data/sample/online-retail/2010-12-02.csv"

    published = await asyncio.to_thread(fulfilment, env, "publish", str(orders))
    assert published.returncode == 4
    [line] = published.stderr.splitlines()
    assert line == (
        "fulfilment: RabbitMQ refused an operation: ACCESS_REFUSED - access to exchange 'orders'"
        " in vhost '/' refused for user 'fulfilment-monitoring'"
    )

    worker = WorkerProcess(dict(env), tmp_path / "worker.log")
    worker.start(wait_ready=False)
    assert worker.process is not None
    assert await asyncio.to_thread(worker.process.wait, 60) == 4
    [refusal] = [
        line for line in worker.log_lines() if line.get("event") == "worker.broker_refused"
    ]
    assert (
        "refused user 'fulfilment-monitoring' an operation its permissions do not allow"
        in (refusal["reason"])
    )
    assert "ACCESS_REFUSED" in refusal["reason"]
