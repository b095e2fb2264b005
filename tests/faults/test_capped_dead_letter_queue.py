"""A length cap on the dead-letter queue, by argument or by broker policy, with each overflow.

Each scenario runs a worker on a virtual host of its own (the policies it sets touch nothing
else), caps ``fulfilment.order-placed.dlq`` at :data:`CAP` messages, and publishes valid
orders with malformed ones among them (``version`` 2: permanent failures that carry their
event id, so the product's reconciliation finds them in the DLQ or reports them missing).

* A cap that refuses (``reject-publish``, named by the policy, or the DLQ's own argument under
  an operator policy's ``max-length``, which cannot name an overflow): the broker nacks the
  dead letters past the cap, the worker holds those deliveries unacknowledged and retries,
  valid orders go on being reserved beside them, and once the cap is lifted every dead letter
  is in the DLQ: none lost.
* A cap that drops (a policy naming ``drop-head``, or ``reject-publish-dlx``, which quorum
  queues treat as ``drop-head``): the policy wins over the DLQ's argument, and the broker
  confirms each new dead letter while dropping the oldest; no publisher can see it. The
  losses are counted by the alert ``FulfilmentDeadLettersMissing`` (dead letters the workers
  published minus the growth of the DLQ), computed here from the worker's own metrics.
* A cap by queue argument: the worker refuses to start, naming the argument.

The broker is never restarted.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import aio_pika
import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from fulfilment.adapters.rabbitmq.connection import connect
from fulfilment.adapters.rabbitmq.inspection import browse_dead_letters
from fulfilment.adapters.rabbitmq.publishing import OutgoingEvent
from fulfilment.contracts.topology import ORDER_PLACED_DEAD_LETTER_QUEUE, ORDER_PLACED_QUEUE
from fulfilment.entrypoints.cli.options import tool_options
from fulfilment.settings import BrokerSettings, DatabaseSettings, Settings
from fulfilment.tools.report import Reconciliation, reconcile
from tests.e2e.harness import put_stock, queue_depth
from tests.faults.faultlib import (
    AMPLE_STOCK,
    LIMIT,
    Cluster,
    declare,
    publish,
    record_figures,
    synthetic_orders,
)

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

CAP = 2
"""Messages the DLQ may hold in every scenario."""
VALID = 40
MALFORMED = 8
DLQ_PATTERN = r"^fulfilment\.order-placed\.dlq$"

Cap = tuple[str, dict[str, object]]
"""The ``rabbitmqctl`` command that sets the policy, and the policy's definition."""

REFUSING: dict[str, Cap] = {
    "operator policy max-length": ("set_operator_policy", {"max-length": CAP}),
    "policy reject-publish": ("set_policy", {"max-length": CAP, "overflow": "reject-publish"}),
}
DROPPING: dict[str, Cap] = {
    "policy drop-head": ("set_policy", {"max-length": CAP, "overflow": "drop-head"}),
    "policy reject-publish-dlx": (
        "set_policy",
        {"max-length": CAP, "overflow": "reject-publish-dlx"},
    ),
}


def rabbitmqctl(*args: str) -> str:
    result = subprocess.run(
        ["rabbitmqctl", "-q", *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"rabbitmqctl {args[0]}: {result.stderr}{result.stdout}"
    return result.stdout


@pytest.fixture
async def vhost_broker(
    private_vhost_url: str,
) -> AsyncIterator[aio_pika.abc.AbstractRobustConnection]:
    connection = await aio_pika.connect_robust(private_vhost_url)
    try:
        yield connection
    finally:
        await connection.close()


@pytest.fixture
def capped_cluster(
    worker_env: dict[str, str], private_vhost_url: str, tmp_path: Path
) -> Iterator[Cluster]:
    env = {
        **worker_env,
        "FULFILMENT_AMQP_URL": private_vhost_url,
        "FULFILMENT_QUEUE_POLL_INTERVAL_SECONDS": "1",
        "FULFILMENT_LOG_LEVEL": "INFO",
    }
    cluster = Cluster(env, tmp_path)
    yield cluster
    cluster.kill_all()


def vhost_of(url: str) -> str:
    return urllib.parse.unquote(urllib.parse.urlsplit(url).path.lstrip("/"))


def malformed_events(count: int) -> list[OutgoingEvent]:
    """Orders of an unknown version: refused as permanent, with an event id to reconcile."""
    events = []
    for _ in range(count):
        event_id = uuid.uuid4()
        body = {
            "version": 2,
            "event_id": str(event_id),
            "order_id": str(uuid.uuid4()),
            "placed_at": datetime.now(UTC).isoformat(),
            "lines": [{"sku": "SKU000", "quantity": 1}],
        }
        events.append(OutgoingEvent(json.dumps(body).encode(), str(event_id)))
    return events


def scrape(port: int) -> dict[str, float]:
    """The worker's metrics of this scenario, summed over their labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    figures = {"dead_lettered": 0.0, "held": 0.0, "refusals": 0.0, "dlq_ready": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "fulfilment_events_total":
                if sample.labels["outcome"] == "dead_lettered":
                    figures["dead_lettered"] += sample.value
            elif sample.name == "fulfilment_dead_letters_held":
                figures["held"] = sample.value
            elif sample.name == "fulfilment_dead_letter_publish_failures_total":
                figures["refusals"] = sample.value
            elif (
                sample.name == "fulfilment_queue_messages_ready"
                and sample.labels["queue"] == ORDER_PLACED_DEAD_LETTER_QUEUE
            ):
                figures["dlq_ready"] = sample.value
    return figures


async def wait_until(
    predicate: Callable[[], Awaitable[bool]], what: str, timeout: float = 90
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.5)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}")


@dataclass(frozen=True)
class CappedRun:
    """What one scenario measured.

    ``peak``: the worker's figures once every valid order was reserved and every dead letter
    stored or held; ``settled``: at the end; ``classes``: the DLQ's messages by failure
    class at the end; ``in_dlq_under_cap``: the DLQ's depth at the
    peak; ``missing_by_alert``: what ``FulfilmentDeadLettersMissing`` counts at the peak.
    """

    result: Reconciliation
    classes: Counter[str]
    peak: dict[str, float]
    settled: dict[str, float]
    in_dlq_under_cap: int
    missing_by_alert: float
    main_queue: int


async def run_capped(
    case: str,
    command: str,
    definition: dict[str, object],
    *,
    cluster: Cluster,
    broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
    url: str,
    database_url: str,
) -> CappedRun:
    """Cap the DLQ, run the orders through one worker; return the figures of the scenario."""
    vhost = vhost_of(url)
    await put_stock(db, AMPLE_STOCK)
    await declare(url, LIMIT)
    rabbitmqctl(
        command, "-p", vhost, "cap", DLQ_PATTERN, json.dumps(definition), "--apply-to", "queues"
    )
    (worker,) = cluster.start(1, wait_ready=True)
    valid = synthetic_orders(VALID, seed=31)
    malformed = malformed_events(MALFORMED)
    events = [order.event() for order in valid]
    for index, event in enumerate(malformed):  # spread among the valid orders
        events.insert(index * (VALID // MALFORMED) + 1, event)
    await publish(broker, events)

    async def all_settled_or_held() -> bool:
        figures = scrape(worker.port)
        processed = int(await db.fetchval("SELECT count(*) FROM inbox_messages"))
        return bool(processed == VALID and figures["dead_lettered"] + figures["held"] == MALFORMED)

    await wait_until(all_settled_or_held, "valid orders reserved, dead letters stored or held")
    await asyncio.sleep(2)  # two queue polls: the DLQ gauge catches up with the queue
    peak = scrape(worker.port)
    in_dlq_under_cap = await queue_depth(broker, ORDER_PLACED_DEAD_LETTER_QUEUE)
    refusing = case in REFUSING
    if refusing:
        clear = "clear_operator_policy" if command == "set_operator_policy" else "clear_policy"
        rabbitmqctl(clear, "-p", vhost, "cap")

        async def all_in_dlq() -> bool:
            return int(await queue_depth(broker, ORDER_PLACED_DEAD_LETTER_QUEUE)) == MALFORMED

        await wait_until(all_in_dlq, "every held dead letter stored once the cap was lifted")
    settled = scrape(worker.port)
    async with connect(url) as connection:
        classes = (await browse_dead_letters(connection, ORDER_PLACED_DEAD_LETTER_QUEUE)).by_reason
    settings = Settings(
        database=DatabaseSettings(url=SecretStr(database_url)),
        broker=BrokerSettings(amqp_url=SecretStr(url)),
    )
    result = await reconcile(
        tool_options(settings),
        [order.event_id for order in valid] + [uuid.UUID(e.message_id) for e in malformed],
    )
    # FulfilmentDeadLettersMissing: dead letters published minus the growth of the DLQ (empty
    # at the start), as Prometheus computes it from the same two series.
    return CappedRun(
        classes=Counter(failure_class for failure_class, _ in classes.elements()),
        result=result,
        peak=peak,
        settled=settled,
        in_dlq_under_cap=in_dlq_under_cap,
        missing_by_alert=peak["dead_lettered"] - peak["dlq_ready"],
        main_queue=await queue_depth(broker, ORDER_PLACED_QUEUE),
    )


@pytest.mark.parametrize("case", list(REFUSING))
async def test_a_dlq_cap_that_refuses_holds_every_dead_letter_until_it_is_lifted(
    case: str,
    capped_cluster: Cluster,
    vhost_broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
    private_vhost_url: str,
    clean_database: str,
) -> None:
    command, definition = REFUSING[case]
    run = await run_capped(
        case,
        command,
        definition,
        cluster=capped_cluster,
        broker=vhost_broker,
        db=db,
        url=private_vhost_url,
        database_url=clean_database,
    )
    result, peak, settled = run.result, run.peak, run.settled

    assert peak["held"] >= 1, "the cap never refused a dead letter"
    assert peak["refusals"] >= peak["held"]
    assert run.missing_by_alert == 0
    assert result.missing == frozenset(), result.describe()
    assert result.dead_lettered == MALFORMED
    assert result.processed == VALID
    assert result.invariants_hold
    assert settled["held"] == 0
    assert run.main_queue == 0
    # Each kept its reason: stored by the worker, not dead-lettered by the broker for it.
    assert run.classes == {"permanent": MALFORMED}
    record_figures(
        f"capped dead-letter queue ({case})",
        f"{'operator policy' if command == 'set_operator_policy' else 'policy'} "
        f"{json.dumps(definition)} on the DLQ; {MALFORMED} permanent failures among "
        f"{VALID} orders; cap lifted after",
        result,
        reason=(
            f"{run.in_dlq_under_cap} stored under the cap, {int(peak['held'])} held "
            f"({int(settled['refusals'])} refusals, alert FulfilmentDeadLetterPublishFailing), "
            f"all {MALFORMED} in the DLQ once lifted; 0 lost"
        ),
    )


@pytest.mark.parametrize("case", list(DROPPING))
async def test_a_dlq_cap_that_drops_loses_dead_letters_no_client_can_see_and_the_alert_counts_them(
    case: str,
    capped_cluster: Cluster,
    vhost_broker: aio_pika.abc.AbstractRobustConnection,
    db: asyncpg.Connection,
    private_vhost_url: str,
    clean_database: str,
) -> None:
    command, definition = DROPPING[case]
    run = await run_capped(
        case,
        command,
        definition,
        cluster=capped_cluster,
        broker=vhost_broker,
        db=db,
        url=private_vhost_url,
        database_url=clean_database,
    )
    result, peak = run.result, run.peak

    # The broker confirmed every dead letter: nothing was refused, nothing held.
    assert peak["refusals"] == 0
    assert peak["dead_lettered"] == MALFORMED
    lost = len(result.missing)
    assert lost == MALFORMED - run.in_dlq_under_cap
    assert lost > 0, "the policy did not drop: the broker's precedence changed"
    assert run.missing_by_alert == lost  # FulfilmentDeadLettersMissing fires with them
    assert result.processed == VALID
    assert result.invariants_hold
    record_figures(
        f"capped dead-letter queue ({case})",
        f"policy {json.dumps(definition)} on the DLQ; {MALFORMED} permanent failures among "
        f"{VALID} orders",
        result,
        reason=(
            f"the policy's overflow wins over the DLQ's reject-publish: {lost} of {MALFORMED} "
            f"dropped by the broker, confirmed to the worker; counted by alert "
            f"FulfilmentDeadLettersMissing ({int(run.missing_by_alert)})"
        ),
    )


async def test_a_dlq_capped_by_argument_stops_the_start_with_one_line(
    worker_env: dict[str, str],
    private_vhost_url: str,
    vhost_broker: aio_pika.abc.AbstractRobustConnection,
) -> None:
    await declare(private_vhost_url, LIMIT)
    channel = await vhost_broker.channel()
    await channel.queue_delete(ORDER_PLACED_DEAD_LETTER_QUEUE)
    await channel.declare_queue(
        ORDER_PLACED_DEAD_LETTER_QUEUE,
        durable=True,
        arguments={
            "x-queue-type": "quorum",
            "x-delivery-limit": 1_000_000,
            "x-overflow": "reject-publish",
            "x-max-length": CAP,
        },
    )
    await channel.close()
    env = {**worker_env, "FULFILMENT_AMQP_URL": private_vhost_url}

    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fulfilment", env=env, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)

    assert process.returncode == 1
    assert time.monotonic() - started < 60
    lines = [line for line in stderr.decode().splitlines() if "topology_mismatch" in line]
    assert lines, stderr.decode()[-2000:]
    assert f"queue '{ORDER_PLACED_DEAD_LETTER_QUEUE}' exists with x-max-length={CAP}" in lines[0]
