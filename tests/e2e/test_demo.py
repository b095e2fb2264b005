"""The README's first command, ``fulfilment demo``, on the shipped sample of real orders."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import asyncpg
import psutil
import pytest
from sqlalchemy.engine import make_url

from fulfilment.contracts.result_events import RESULT_EVENTS
from fulfilment.contracts.topology import DEAD_LETTER_EXCHANGE, EVENTS_EXCHANGE, ORDER_PLACED
from fulfilment.demo.children import LOG_DIR
from fulfilment.demo.result_events import RESULT_EVENTS_QUEUE
from tests.support.services import throwaway_database

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.rabbitmq]

SAMPLE = Path(__file__).parents[2] / "data" / "sample" / "online-retail"
# The whole data set is not shipped; point FULFILMENT_TEST_ONLINE_RETAIL_DIR at its folder of
# daily CSV files to run the demo on it too.
REAL_DATA = Path(os.environ.get("FULFILMENT_TEST_ONLINE_RETAIL_DIR", "/nonexistent"))


def demo(
    env: dict[str, str], *arguments: str, data: Path = SAMPLE
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).with_name("fulfilment")), "demo", str(data), *arguments],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


async def stock_fingerprint(db: asyncpg.Connection) -> tuple[int, int, int, str]:
    row = await db.fetchrow(
        "SELECT count(*), sum(on_hand), sum(reserved),"
        " md5(string_agg(sku || ':' || on_hand || ':' || reserved, ',' ORDER BY sku))"
        " FROM stock_levels"
    )
    return int(row[0]), int(row[1]), int(row[2]), str(row[3])


def result_event_lines(out: str) -> dict[str, tuple[int, int, int]]:
    """``{routing key: (published, received, duplicates)}`` from the demo's result event lines."""
    found = {
        match["key"]: (int(match["published"]), int(match["received"]), int(match["again"]))
        for match in re.finditer(
            r"^  (?P<key>stock\.\w+): published (?P<published>\d+), received (?P<received>\d+)"
            r" \(duplicates (?P<again>\d+)\)$",
            out,
            re.MULTILINE,
        )
    }
    assert set(found) == set(RESULT_EVENTS), out
    return found


@pytest.fixture(autouse=True)
def demo_queue_deleted_afterwards(amqp_url: str) -> Iterator[None]:
    """Delete the demo's queue after each test: bound to ``fulfilment.events`` with ``#`` and
    durable, it would take the result events of every later test on the session's vhost, so
    that none could ever be returned as unroutable (``tests/e2e/test_relay.py``)."""
    yield

    async def delete() -> None:
        async with await aio_pika.connect(amqp_url) as connection:
            channel = await connection.channel()
            await channel.queue_delete(RESULT_EVENTS_QUEUE)

    # In a thread of its own: the test's event loop is pytest-asyncio's, not this one's.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as thread:
        thread.submit(asyncio.run, delete()).result()


async def outbox_rows(db: asyncpg.Connection) -> dict[str, int]:
    rows = await db.fetch("SELECT routing_key, count(*) FROM outbox GROUP BY routing_key")
    return {row["routing_key"]: int(row["count"]) for row in rows}


async def demo_queue_depth(amqp_url: str) -> int:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(RESULT_EVENTS_QUEUE, passive=True)
        return int(queue.declaration_result.message_count or 0)
    finally:
        await connection.close()


async def demo_queue_exists(amqp_url: str) -> bool:
    """Whether the vhost holds the demo's queue (and so its ``#`` binding, which goes with it)."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        try:
            await channel.declare_queue(RESULT_EVENTS_QUEUE, passive=True)
        except aio_pika.exceptions.ChannelNotFoundEntity:
            return False
        return True
    finally:
        await connection.close()


WAREHOUSE_DAY = re.compile(
    r"^(?P<day>\d{4}-\d\d-\d\d): warehouse received (?P<orders>\d+) fulfilment orders for"
    r" (?P<reserved>\d+) reservations, cancellations accepted (?P<accepted>\d+),"
    r" refused (?P<refused>\d+)$",
    re.MULTILINE,
)


def warehouse_days(out: str) -> dict[str, tuple[int, int, int, int]]:
    """``{day: (orders received, reservations, accepted, refused)}`` from the warehouse lines."""
    return {
        match["day"]: (
            int(match["orders"]),
            int(match["reserved"]),
            int(match["accepted"]),
            int(match["refused"]),
        )
        for match in WAREHOUSE_DAY.finditer(out)
    }


NEWS_DAY = re.compile(
    r"^(?P<day>\d{4}-\d\d-\d\d): warehouse sent shipments (?P<shipments>\d+) \(tracking numbers"
    r" (?P<tracking>\d+), found by the poll (?P<shipments_polled>\d+)\), orders shipped in whole"
    r" (?P<whole>\d+), in part (?P<part>\d+), not at all (?P<none>\d+); its own cancellations"
    r" (?P<cancellations>\d+) \(found by the poll (?P<cancellations_polled>\d+)\), units"
    r" released (?P<released>\d+); webhooks never sent (?P<unsent>\d+)$",
    re.MULTILINE,
)


def news_days(out: str) -> dict[str, dict[str, int]]:
    """``{day: {shipments, tracking, ..., unsent}}`` from the lines of the warehouse's news."""
    return {
        match["day"]: {
            name: int(value) for name, value in match.groupdict().items() if name != "day"
        }
        for match in NEWS_DAY.finditer(out)
    }


def assert_warehouse_system_stopped(out: str) -> None:
    """The demo's simulator, intake and dispatcher are gone: their pids and their ports."""
    started = re.search(
        r"^warehouse system: simulator at http://127\.0\.0\.1:(?P<port>\d+)/api/v1 \(pid"
        r" (?P<simulator>\d+), pick delay 1 s, log \S+\), webhooks to"
        r" http://127\.0\.0\.1:(?P<intake_port>\d+)/webhooks/warehouse \(intake pid"
        r" (?P<intake>\d+), log \S+\), dispatcher started \(pid (?P<dispatcher>\d+), ",
        out,
        re.MULTILINE,
    )
    assert started, out
    for pid in (int(started["simulator"]), int(started["dispatcher"]), int(started["intake"])):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    for port in (int(started["port"]), int(started["intake_port"])):
        with (
            pytest.raises(ConnectionRefusedError),
            socket.create_connection(("127.0.0.1", port)),
        ):
            pass


async def order_states(db: asyncpg.Connection) -> dict[str, int]:
    rows = await db.fetch("SELECT status, count(*) FROM reservations GROUP BY status")
    return {row["status"]: int(row["count"]) for row in rows}


DAY_LINE = re.compile(
    r"^(?P<day>\d{4}-\d\d-\d\d): orders (?P<orders>\d+ \([^)]*\)), cancellations"
    r" (?P<cancellations>\d+(?: \([^)]*\))?), warehouse shipments (?P<shipments>\d+)"
    r"(?: \(shipped (?P<shipped_outcome>\d+)\))?; units reserved (?P<reserved>\d+), released"
    r" (?P<released>\d+), released by the warehouse (?P<released_by_warehouse>\d+), shipped"
    r" (?P<shipped>\d+), adjusted by the warehouse \+(?P<received>\d+) -(?P<removed>\d+);"
    r" stock now on hand (?P<on_hand>\d+), reserved (?P<left>\d+)$",
    re.MULTILINE,
)


def day_lines(out: str) -> dict[str, re.Match[str]]:
    return {match["day"]: match for match in DAY_LINE.finditer(out)}


SETTLED = re.compile(
    r"^2010-12-02: the shortage of 22109 settled by the warehouse's cancellation of"
    r" (?P<units>\d+) units? of it \((?P<ids>CXL-[-\w, ]+), unfulfillable\): on hand"
    r" (?P<on_hand>\d+), reserved 0; stock.shortage short 1 -> 0$",
    re.MULTILINE,
)
DRIFT_AGREES = (
    "stock drift (fulfilment stock drift, the service's on hand beside the warehouse's):\n"
    "  1368 SKU(s) compared with the warehouse's inventory as of "
)


async def test_the_demo_ships_the_sample_from_the_warehouse_s_webhooks_and_a_second_run_changes_nothing(  # noqa: E501, PLR0915
    worker_env: dict[str, str], db: asyncpg.Connection, amqp_url: str
) -> None:
    first = demo(worker_env, "--reset")
    assert first.returncode == 0, first.stderr[-2000:]
    out = first.stdout
    assert (
        "none of these events is in this database's inbox yet (170 orders, 1 cancellation,"
        " their shipments): a first run"
    ) in out
    assert (
        "cancellations mapped to their order: 1 (not mapped: no customer 1, not negative 0,"
        " no earlier order 30, not held 1, several orders 0)" in out
    )
    days = day_lines(out)
    assert list(days) == ["2010-12-02", "2010-12-23"], out
    # Order 536755 asks for 1 of 22109, which the warehouse's damage left short before it came.
    assert days["2010-12-02"]["orders"] == "143 (rejected 35, reserved 108)"
    # C539949 cancels an order of 2 December that was rejected: nothing to give back.
    assert days["2010-12-23"]["orders"] == "27 (rejected 4, reserved 23)"
    assert days["2010-12-23"]["cancellations"] == "1 (cancel_ignored 1)"
    news = news_days(out)
    assert list(news) == list(days)
    for day, line in days.items():
        # Every unit the day reserved left with a shipment of the warehouse or was given back
        # by one of its cancellations; nothing is left reserved.
        assert int(line["reserved"]) == int(line["shipped"]) + int(line["released_by_warehouse"])
        assert (int(line["released"]), int(line["left"])) == (0, 0)
        assert int(line["shipments"]) == int(line["shipped_outcome"]) == news[day]["shipments"]
        assert int(line["released_by_warehouse"]) == news[day]["released"]
        assert (
            news[day]["shipments_polled"] + news[day]["cancellations_polled"]
            >= (news[day]["unsent"])
        )
        assert news[day]["tracking"] >= news[day]["shipments"]
        assert (
            f"{day}: stock checked: on hand = as the run began + adjustments applied - units"
            " shipped, reserved = units the reserved orders' lines hold, for every SKU; short SKUs"
            " (after a reported loss) 0"
        ) in out
    # The warehouse's receipt and damage, staged at the first day's middle order with its
    # work held: the damage leaves 22109 short, the next order asking for it is refused, and
    # the warehouse's cancellation of what its shelf lacks settles it.
    assert (days["2010-12-02"]["received"], days["2010-12-02"]["removed"]) == ("12", "2")
    assert (days["2010-12-23"]["received"], days["2010-12-23"]["removed"]) == ("0", "0")
    assert (
        "2010-12-02: at 13:45, the warehouse's work held, it received 12 of 22616 (on hand 653 ->"
        " 665) and found 2 of 22109 damaged while the morning's orders held 24 of its 25: on hand"
        " 23, reserved 24, short 1 (stock.adjusted 2, stock.shortage short 1)\n"
        "2010-12-02: 22109 short: order 536755 asking for 1 of it (1 were available before the"
        " damage) rejected insufficient_stock naming it; its reserved stays 24\n"
    ) in out
    settled = SETTLED.search(out)
    assert settled, out
    assert out.index(DRIFT_AGREES) > out.index("2010-12-23: stock checked")
    assert re.search(
        r"^  1368 SKU\(s\) compared .*: 1368 agree, 0 differ by units of orders in flight,"
        r" 0 unexplained$",
        out,
        re.MULTILINE,
    ), out
    assert sum(n["whole"] + n["part"] + n["none"] for n in news.values()) == 131
    totals = {name: sum(n[name] for n in news.values()) for name in next(iter(news.values()))}
    # The simulator's knobs at work on the sample: split shipments, a few of the warehouse's
    # own cancellations, a few webhooks never sent that the dispatcher's poll found.
    assert totals["shipments"] > totals["whole"] + totals["part"], totals
    assert totals["cancellations"] > 0, totals
    assert totals["unsent"] > 0, totals
    assert sum(int(d["reserved"]) for d in days.values()) == 21081 + 3198
    assert "published 170 OrderPlaced, 1 OrderCancelled and 0 OrderShipped events" in out
    # The children's logs in one folder, named in one line, replaced by the next run.
    assert f"logs of the relay, the warehouse system and the worker: {LOG_DIR}" in out
    assert f"log {LOG_DIR / 'relay.log'})" in out
    assert f"log {LOG_DIR / 'webhooks.log'})" in out
    assert (
        "this run's outcomes\n"
        "  order_placed: rejected:insufficient_stock 32, rejected:unknown_sku 7, reserved 131\n"
        "  order_cancelled: ignored 1\n"
    ) in out
    for kind, count in (("OrderPlaced", 170), ("OrderCancelled", 1), ("OrderShipped", 0)):
        assert (
            f"{kind}: reconciled {count} published events: {count} processed, 0 in the"
            " dead-letter queue, 0 missing"
        ) in out
    assert "stock invariants               hold" in out
    # The demo's own consumer of fulfilment.events received every result event the run wrote:
    # one stock.shipped per shipment of the warehouse, one stock.released per cancellation, one
    # stock.adjusted per adjustment staged, one stock.shortage per change of the shortfall.
    assert "relay stopped with exit code 0" in out
    assert "intake stopped with exit code 0" in out
    received = result_event_lines(out)
    assert {key: (published, got) for key, (published, got, _) in received.items()} == {
        "stock.reserved": (131, 131),
        "stock.rejected": (39, 39),
        "stock.released": (totals["cancellations"], totals["cancellations"]),
        "stock.shipped": (totals["shipments"], totals["shipments"]),
        "stock.cancel_refused": (0, 0),
        "stock.adjusted": (2, 2),
        "stock.shortage": (2, 2),
    }
    assert await outbox_rows(db) == {
        key: published for key, (published, _, _) in received.items() if published
    }
    assert await db.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 0
    assert await demo_queue_depth(amqp_url) == 0  # read to the end, every message acknowledged
    # The rows of the warehouse's news: each shipment once, the poll's among them.
    shipments = await db.fetch(
        "SELECT source, outcome, count(*) FROM warehouse_shipments GROUP BY 1, 2"
    )
    assert sum(row["count"] for row in shipments) == totals["shipments"]
    assert {row["outcome"] for row in shipments} == {"shipped"}
    polled = sum(row["count"] for row in shipments if row["source"] == "poll")
    assert polled == totals["shipments_polled"]
    taken = await db.fetchval("SELECT sum(taken) FROM warehouse_shipment_lines")
    assert taken == sum(int(d["shipped"]) for d in days.values())
    assert await db.fetchval("SELECT count(*) FROM warehouse_discrepancies") == 0
    adjustments = await db.fetch(
        "SELECT sku, delta, applied, reason, source FROM warehouse_adjustments ORDER BY delta"
    )
    assert [tuple(row) for row in adjustments] == [
        ("22109", -2, -2, "damaged", "webhook"),
        ("22616", 12, 12, "received", "webhook"),
    ]
    released = await db.fetch(
        "SELECT c.cancellation_id, l.released FROM warehouse_cancellations c"
        " JOIN warehouse_cancellation_lines l USING (cancellation_id)"
        " WHERE l.sku = '22109' AND l.released > 0"
    )
    assert {row["cancellation_id"] for row in released} == set(settled["ids"].split(", "))
    assert sum(row["released"] for row in released) == int(settled["units"])
    # The shelf lacked 1 unit: 0 left, unless the warehouse also cancelled units of it on its
    # own (its cancel rate), which then stayed on the shelf.
    assert tuple(
        await db.fetchrow("SELECT on_hand, reserved FROM stock_levels WHERE sku = '22109'")
    ) == (int(settled["units"]) - 1, 0)
    before = await stock_fingerprint(db)
    # What the warehouse's shipments left: the units it cancelled stayed on hand, and the
    # adjustments applied (+12 -2); 536755's 15 units, refused, were never reserved.
    assert before[1:3] == (12214 + 15 + 12 - 2 + totals["released"], 0)
    states = await order_states(db)
    assert states["rejected"] == 39
    assert states["shipped"] + states.get("released", 0) == 131
    # The hand-off: each day's reservations are the warehouse's orders, one each.
    handed = warehouse_days(out)
    assert handed["2010-12-02"] == (108, 108, 0, 0)
    assert len(handed) == len(days)  # one warehouse line per day
    assert all(orders == reserved for orders, reserved, _, _ in handed.values())
    assert sum(orders for orders, _, _, _ in handed.values()) == 131
    assert re.search(
        r"^warehouse system \(simulator, pick delay 1 s\): received 131 fulfilment orders for 131"
        r" reservations, cancellations accepted 0, refused 0; sent shipments \d+ .*; each checked"
        r" against the reservations and the simulator's record; dispatcher stopped with exit"
        r" code 0$",
        out,
        re.MULTILINE,
    ), out
    requests = await db.fetch(
        "SELECT kind, status, count(*), count(DISTINCT order_id), count(DISTINCT warehouse_id)"
        " FROM warehouse_requests GROUP BY kind, status"
    )
    assert [tuple(row) for row in requests] == [("fulfilment_order", "accepted", 131, 131, 131)]
    assert_warehouse_system_stopped(out)

    second = demo(worker_env)

    assert second.returncode == 0, second.stderr[-2000:]
    assert (
        "played before: this database's inbox already holds 170 of these 170 orders, 1 of the 1"
        " cancellation, and 131 of the orders shipped; those are answered as duplicates and"
        " change nothing"
    ) in second.stdout
    assert "loaded 0 planned stock levels; 1368 SKUs kept the level they had" in second.stdout
    # Its days count each event as the duplicate the worker answered, not as the first run did.
    assert (
        "2010-12-02: orders 143 (duplicate 143), cancellations 0, warehouse shipments 0;"
        " units reserved 0, released 0, released by the warehouse 0, shipped 0, adjusted by the"
        f" warehouse +0 -0; stock now on hand {before[1]}, reserved 0"
    ) in second.stdout
    # No order holds stock at the cut: the warehouse reports no receipt and no damage, and its
    # shelves, loaded with the service's levels, agree with them.
    assert (
        "2010-12-02: at 13:45 no order holds stock the afternoon also asks for: the warehouse's"
        " receipt and damage wait for another day"
    ) in second.stdout
    assert DRIFT_AGREES in second.stdout
    assert (
        "2010-12-23: orders 27 (duplicate 27), cancellations 1 (duplicate 1),"
        " warehouse shipments 0; units reserved 0"
    ) in second.stdout
    assert (
        "this run's outcomes\n"
        "  order_placed: duplicate:event 170\n"
        "  order_cancelled: duplicate:event 1\n"
    ) in second.stdout
    nothing = dict.fromkeys(RESULT_EVENTS, (0, 0))
    assert {key: counts[:2] for key, counts in result_event_lines(second.stdout).items()} == nothing
    assert "this run wrote no result event: its events changed nothing" in second.stdout
    # Nothing reserved again, nothing handed off again (a new simulator received nothing and
    # shipped nothing).
    assert set(warehouse_days(second.stdout).values()) == {(0, 0, 0, 0)}
    assert all(not any(counts.values()) for counts in news_days(second.stdout).values())
    assert (
        "warehouse system (simulator, pick delay 1 s): received 0 fulfilment orders for 0"
        " reservations, cancellations accepted 0, refused 0;"
    ) in second.stdout
    assert_warehouse_system_stopped(second.stdout)
    assert "relay stopped with exit code 0" in second.stdout
    assert await stock_fingerprint(db) == before
    assert await order_states(db) == states
    assert await db.fetchval("SELECT count(*) FROM reservations") == 170


async def test_a_result_event_the_contract_refuses_fails_the_demo_with_one_line(
    worker_env: dict[str, str], amqp_url: str
) -> None:
    # Another publisher's body on fulfilment.events, in the demo's queue before the run.
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(
            EVENTS_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True
        )
        queue = await channel.declare_queue(RESULT_EVENTS_QUEUE, durable=True)
        await queue.bind(exchange, routing_key="#")
        await exchange.publish(
            aio_pika.Message(b'{"version": 1}', content_type="application/json"),
            routing_key="stock.reserved",
        )
    finally:
        await connection.close()

    run = demo(worker_env)

    assert run.returncode == 1
    assert run.stderr.count("\n") == 1
    assert run.stderr.startswith(
        "fulfilment: result events: 1 invalid (first: a stock.reserved message does not validate: "
    ), run.stderr
    # What the run's events themselves did is still shown, and holds.
    counts = result_event_lines(run.stdout)
    assert all(published == received > 0 for published, received, _ in counts.values() if published)
    assert await demo_queue_depth(amqp_url) == 0


async def test_reset_refuses_a_database_that_is_not_the_demo_s_until_it_is_named_and_records_it(
    worker_env: dict[str, str], db: asyncpg.Connection, amqp_url: str
) -> None:
    name = make_url(worker_env["FULFILMENT_DATABASE_URL"]).database
    one_day = SAMPLE / "2010-12-23.csv"
    # Another team's stock level, in a database the demo did not make or find empty.
    await db.execute(f'COMMENT ON DATABASE "{name}" IS NULL')
    await db.execute("INSERT INTO stock_levels (sku, on_hand) VALUES ('NOT-THE-DEMO', 7)")
    assert not await demo_queue_exists(amqp_url)

    refused = demo(worker_env, "--reset", data=one_day)
    misnamed = demo(worker_env, "--reset", "--confirm-reset", "fulfilment", data=one_day)

    assert (refused.returncode, misnamed.returncode) == (2, 2)
    assert refused.stderr == (
        f"fulfilment: --reset refused: database '{name}' is not the demo's (it did not create it"
        " or find it empty) and holds rows in stock_levels; to empty it anyway, name it:"
        f" --reset --confirm-reset {name} (make demo RESET=1 CONFIRM_RESET={name})\n"
    )
    assert misnamed.stderr == (
        "fulfilment: --confirm-reset 'fulfilment' does not name the database of"
        f" FULFILMENT_DATABASE_URL, '{name}': nothing was emptied\n"
    )
    assert await db.fetchval("SELECT on_hand FROM stock_levels WHERE sku = 'NOT-THE-DEMO'") == 7
    # Nor the broker: no durable queue left bound with `#`, taking every result event.
    assert not await demo_queue_exists(amqp_url)

    named = demo(worker_env, "--reset", "--confirm-reset", name, data=one_day)

    assert named.returncode == 0, named.stderr[-2000:]
    assert re.search(
        rf"^reset \(--confirm-reset {name}\): database {name} as postgres: emptied 1 rows"
        r" \(inbox_messages 0, .*stock_levels 1, .*\); purged \d+ queued messages .* and 0 dead"
        r" letters, each recorded in dead_letter_audit \(run [0-9a-f-]{36}\)$",
        named.stdout,
        re.MULTILINE,
    ), named.stdout
    assert await db.fetchval("SELECT count(*) FROM stock_levels WHERE sku = 'NOT-THE-DEMO'") == 0
    comment = await db.fetchval(
        "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = $1", name
    )
    assert comment.startswith(
        "fulfilment demo database: last emptied by `fulfilment demo --reset`"
        f" (--confirm-reset {name}) at "
    )

    # Now the demo's: --reset alone empties it, and the dead letter it purges is audited.
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        exchange = await channel.get_exchange(DEAD_LETTER_EXCHANGE)
        await exchange.publish(
            aio_pika.Message(b"not an event", message_id="left-in-the-dlq"),
            routing_key=ORDER_PLACED.dead_letter_routing_key,
        )
    finally:
        await connection.close()
    again = demo(worker_env, "--reset", data=one_day)

    assert again.returncode == 0, again.stderr[-2000:]
    assert " and 1 dead letters, each recorded in dead_letter_audit" in again.stdout
    # The same orders again, on emptied tables: their warehouse requests went with them, so
    # none is refused (and dead-lettered) as a second fulfilment order of its order.
    assert (
        "OrderPlaced: reconciled 27 published events: 27 processed, 0 in the dead-letter queue,"
        " 0 missing"
    ) in again.stdout
    audit = await db.fetchrow(
        "SELECT action, operator, comment FROM dead_letter_audit WHERE message_id = $1",
        "left-in-the-dlq",
    )
    assert dict(audit) == {
        "action": "purged",
        "operator": "postgres (fulfilment demo --reset)",
        "comment": "fulfilment demo --reset",
    }


@pytest.mark.skipif(
    not REAL_DATA.is_dir(), reason="FULFILMENT_TEST_ONLINE_RETAIL_DIR names no folder"
)
def test_on_the_whole_data_set_the_demo_queue_receives_every_kind_of_result_event(
    worker_env: dict[str, str],
) -> None:
    # The sample's one cancellation releases nothing; the 20 days have partial and whole
    # releases, so every routing key is counted on both sides.
    run = demo(worker_env, "--reset", data=REAL_DATA)

    assert run.returncode == 0, run.stderr[-2000:]
    counts = result_event_lines(run.stdout)
    for key, (published, received, _) in counts.items():
        assert published == received > 0, (key, counts)


def test_reset_refuses_another_application_s_database_before_migrating_it(
    worker_env: dict[str, str], amqp_url: str
) -> None:
    with throwaway_database("fulfilment_other_app") as url:

        async def prepare() -> None:
            connection = await asyncpg.connect(
                make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
            )
            try:
                await connection.execute("CREATE TABLE invoices (id int PRIMARY KEY)")
                await connection.execute("INSERT INTO invoices VALUES (1), (2)")
            finally:
                await connection.close()

        asyncio.run(prepare())
        env = {**worker_env, "FULFILMENT_DATABASE_URL": url}
        name = make_url(url).database

        refused = demo(env, "--reset", data=SAMPLE / "2010-12-23.csv")

        assert refused.returncode == 2
        assert refused.stderr == (
            f"fulfilment: --reset refused: database '{name}' is not the demo's (it did not"
            " create it or find it empty) and holds tables that are not the service's:"
            f" invoices; to empty it anyway, name it: --reset --confirm-reset {name}"
            f" (make demo RESET=1 CONFIRM_RESET={name})\n"
        )

        async def tables() -> list[str]:
            connection = await asyncpg.connect(
                make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
            )
            try:
                rows = await connection.fetch(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
                )
                return [row[0] for row in rows]
            finally:
                await connection.close()

        assert asyncio.run(tables()) == ["invoices"]  # not migrated: nothing changed
        assert not asyncio.run(demo_queue_exists(amqp_url))  # nor declared on the broker
