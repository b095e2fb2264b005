"""The benchmark's adjustments (bench/workload.py, webhooks.py, run.py): plans, parsing, reports.

Pure pieces, no service: the adjustments planned and signed, the bursts of a round, the
checks' arithmetic, the ratios of the webhooks' table, a variant's ``adjust`` item, and the
lines the drain's report gives of what the adjustments did.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import json
import math
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from standardwebhooks import Webhook

from fulfilment.contracts.result_events import RESULT_EVENTS
from fulfilment.contracts.warehouse_webhooks import InventoryAdjustedWebhook

BENCH = Path(__file__).resolve().parents[2] / "bench"
# bench/ is a folder of scripts that import each other by their names, as when run from it;
# the folder is on the path while they are imported, and no longer.
sys.path.insert(0, str(BENCH))
try:
    workload = importlib.import_module("workload")
    run = importlib.import_module("run")
    webhooks = importlib.import_module("webhooks")
finally:
    sys.path.remove(str(BENCH))

SKUS = tuple(f"SKU-{n:02d}" for n in range(12))


def planned(count, skus=SKUS, seed=3, namespace="test"):
    return list(
        itertools.islice(workload.plan_adjustments(skus, seed=seed, namespace=namespace), count)
    )


# --- the adjustments planned ----------------------------------------------------------------


def test_no_sku_ever_loses_more_than_its_own_adjustments_added_before():
    adjustments = planned(5_000)
    net: Counter[str] = Counter()
    for adjustment in adjustments:
        net[adjustment.sku] += adjustment.delta
        assert net[adjustment.sku] >= 0, adjustment
    assert any(adjustment.delta < 0 for adjustment in adjustments)


def test_gains_are_receipts_or_returns_and_losses_are_small_damages_or_losses():
    for adjustment in planned(2_000):
        if adjustment.delta > 0:
            assert adjustment.reason in {"received", "returned"}
            assert adjustment.delta <= workload.RECEIPT_UNITS[1]
        else:
            assert adjustment.reason in {"damaged", "lost"}
            assert -workload.LOSS_UNITS[1] <= adjustment.delta < 0


def test_the_same_seed_plans_the_same_adjustments_with_ids_of_their_own():
    adjustments = planned(1_000)
    assert planned(1_000) == adjustments
    assert planned(1_000, seed=4) != adjustments
    assert len({adjustment.adjustment_id for adjustment in adjustments}) == 1_000
    other = {a.adjustment_id for a in planned(1_000, namespace="other")}
    assert other.isdisjoint(a.adjustment_id for a in adjustments)


def test_an_adjustments_body_is_an_inventory_adjusted_webhook_of_the_contract():
    (adjustment,) = planned(1)
    sent_at = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    parsed = InventoryAdjustedWebhook.model_validate_json(adjustment.body(sent_at))
    assert parsed.data.adjustment_id == adjustment.adjustment_id
    assert (parsed.data.sku, parsed.data.delta) == (adjustment.sku, adjustment.delta)
    assert str(parsed.data.reason) == adjustment.reason
    assert parsed.timestamp == sent_at


def test_net_deltas_add_each_skus_deltas():
    adjustments = [
        workload.Adjustment("a", "X", 5, "received"),
        workload.Adjustment("b", "Y", 2, "returned"),
        workload.Adjustment("c", "X", -3, "lost"),
    ]
    assert workload.net_deltas(adjustments) == {"X": 2, "Y": 2}


def test_the_hot_skus_are_those_of_most_units_ordered_ties_by_code_point():
    def order(*lines):
        return workload.Order(uuid.uuid4(), uuid.uuid4(), lines)

    orders = [order(("B", 5), ("A", 1)), order(("C", 5)), order(("A", 4), ("D", 2))]
    assert workload.hot_skus(orders, 3) == ["A", "B", "C"]
    assert workload.hot_skus(orders, 10) == ["A", "B", "C", "D"]


def test_a_signed_webhook_verifies_with_the_secret_and_each_has_an_id_of_its_own():
    adjustments = planned(3)
    requests = workload.signed(adjustments, run.WEBHOOK_SECRET)
    verifier = Webhook(run.WEBHOOK_SECRET)
    for (headers, body), adjustment in zip(requests, adjustments, strict=True):
        assert verifier.verify(body, headers)["data"]["adjustment_id"] == (adjustment.adjustment_id)
    assert len({headers["webhook-id"] for headers, _ in requests}) == 3


async def test_a_steady_post_sends_on_schedule_until_stopped_and_records_each_answer():
    received = []

    def answer(request: httpx.Request) -> httpx.Response:
        received.append(json.loads(request.content))
        return httpx.Response(204 if len(received) % 5 else 500)

    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.25, stop.set)
    started = time.monotonic()
    posted = await workload.post_steadily(
        "http://intake.test/webhooks/warehouse",
        workload.plan_adjustments(SKUS, seed=1, namespace="steady"),
        rate=100,
        secret=run.WEBHOOK_SECRET,
        stop=stop,
        transport=lambda: httpx.MockTransport(answer),
    )

    assert time.monotonic() - started < 2
    assert 20 <= len(posted.sent) <= 35  # 100 a second for a quarter of one (or a little more)
    assert [body["data"]["adjustment_id"] for body in received] == [
        adjustment.adjustment_id for adjustment in posted.sent
    ]
    assert posted.answered == {
        "204": len(posted.sent) - len(posted.sent) // 5,
        "500": len(posted.sent) // 5,
    }
    assert posted.rate == pytest.approx(100, rel=0.15)
    assert len(posted.answer_ms) == len(posted.sent)
    assert all(0 <= ms < 1_000 for ms in posted.answer_ms)


def test_a_steady_post_that_sent_nothing_has_no_rate():
    assert math.isnan(workload.SteadyPost().rate)


# --- bench/webhooks.py ------------------------------------------------------------------------


def test_a_round_of_both_kinds_bursts_the_intake_with_each_and_the_reference_with_shipments():
    assert webhooks.round_plan(None, "both") == [
        ("intake", "shipments"),
        ("intake", "adjustments"),
        ("reference", "shipments"),
    ]
    assert webhooks.round_plan(None, "shipments") == [
        ("intake", "shipments"),
        ("reference", "shipments"),
    ]
    assert webhooks.round_plan(None, "adjustments") == [("intake", "adjustments")]
    assert webhooks.round_plan(["intake"], "both") == [
        ("intake", "shipments"),
        ("intake", "adjustments"),
    ]


def test_adjustment_bursts_into_the_reference_are_refused(capsys):
    with pytest.raises(SystemExit):
        webhooks.parse_args(["--kind", "adjustments", "--receiver", "reference"])
    assert "the reference takes shipments only" in capsys.readouterr().err
    assert webhooks.parse_args(["--kind", "both"]).kind == "both"
    assert webhooks.parse_args([]).kind == "shipments"


def test_stock_is_exact_when_each_sku_moved_by_its_deltas_alone():
    adjustments = [
        workload.Adjustment("a", "X", 5, "received"),
        workload.Adjustment("b", "X", -2, "damaged"),
        workload.Adjustment("c", "Y", 1, "returned"),
    ]
    before = {"X": (100, 10, 0), "Y": (50, 0, 3), "Z": (7, 7, 0)}
    right = {"X": (103, 10, 0), "Y": (51, 0, 3), "Z": (7, 7, 0)}
    assert run.stock_wrong(before, right, adjustments) == []
    applied_twice = right | {"X": (106, 10, 0)}
    reserved_moved = right | {"Y": (51, 1, 3)}
    untouched_moved = right | {"Z": (8, 7, 0)}
    missing = {"X": (103, 10, 0), "Z": (7, 7, 0)}
    assert run.stock_wrong(before, applied_twice, adjustments) == ["X"]
    assert run.stock_wrong(before, reserved_moved, adjustments) == ["Y"]
    assert run.stock_wrong(before, untouched_moved, adjustments) == ["Z"]
    assert run.stock_wrong(before, missing, adjustments) == ["Y"]


def test_checked_puts_whether_each_count_is_the_expected_one_beside_it():
    assert run.checked({"rows": 3, "events": 2}, {"rows": 3, "events": 3}) == {
        "rows": 3,
        "rows_ok": True,
        "events": 2,
        "events_ok": False,
    }


def burst(kind, sent, rate, p99, receiver_cpu, postgres_cpu, *, lost=False):
    return webhooks.Burst(
        kind=kind,
        webhooks=1_000,
        rate=rate,
        overall_rate=rate,
        answer_ms={"p50": p99 / 2, "p99": p99, "max": p99 * 2},
        statuses={"204": 1_000},
        cpu_per_1000={
            "receiver": receiver_cpu,
            "senders": 0.5,
            "postgres": postgres_cpu,
            "rest": 0.1,
        },
        peak_rss_mib=100.0,
        checks={"stock_ok": not lost},
        sent=sent,
    )


def test_the_ratios_give_rate_answer_times_and_each_cpu_group_of_one_burst_over_another():
    figures = webhooks.ratios(
        burst("intake", "adjustments", 900, 50, 0.44, 0.6),
        burst("intake", "shipments", 1_000, 40, 0.4, 0.8),
    )
    assert figures["rate"] == pytest.approx(0.9)
    assert figures["p99"] == pytest.approx(1.25)
    assert figures["receiver"] == pytest.approx(1.1)
    assert figures["postgres"] == pytest.approx(0.75)
    assert set(figures) == {"rate", "p50", "p99", "max", "receiver", "senders", "postgres"}


def test_the_table_gives_adjustments_over_shipments_per_round_by_the_medians_and_the_rounds():
    bursts = [
        burst("intake", "shipments", 1_000, 40, 0.40, 0.80),
        burst("intake", "adjustments", 900, 44, 0.44, 0.72),
        burst("intake", "shipments", 500, 80, 0.50, 1.00),
        burst("intake", "adjustments", 550, 80, 0.50, 0.90, lost=True),
        burst("intake", "shipments", 800, 50, 0.45, 0.90),
        burst("intake", "adjustments", 800, 55, 0.45, 0.90),
    ]
    lines = webhooks.report(bursts, 32).splitlines()
    rows = {line.split(" | ")[0].removeprefix("| "): line.split(" | ") for line in lines[2:]}

    assert "`shipment.shipped` or `inventory.adjusted`" in lines[0]
    assert rows["round 1: adjustments / shipments, intake"][1:4] == ["**0.90x**", "1.10x", "1.10x"]
    assert rows["round 2: adjustments / shipments, intake"][1] == "**1.10x**"
    assert rows["round 2: intake, adjustments"][6] == "**yes**"  # its checks failed
    # The medians: 800/s over 800/s; the rounds' own ratios 0.90x, 1.10x, 1.00x.
    assert rows["**median: adjustments / shipments, intake**"][1] == "**1.00x**"
    rounds = rows["**median of the rounds: adjustments / shipments, intake**"]
    assert rounds[1] == "**1.00x**"
    assert rounds[7] == "1.00x"  # receiver CPU: 1.10x, 1.00x, 1.00x
    assert rounds[9] == "0.90x"  # PostgreSQL's: 0.90x, 0.90x, 1.00x
    assert not any("intake / reference" in line for line in lines)  # no reference ran


# --- bench/run.py -----------------------------------------------------------------------------


def test_the_adjust_item_names_a_rate_a_second_or_takes_the_default():
    assert run.adjust_rate("adjust") == run.ADJUST_PER_SECOND == 100
    assert run.adjust_rate("adjust=250") == 250
    assert run.adjust_rate("adjust = 50/s") == 50
    for wrong in ("adjust=0", "adjust=-5", "adjust=fast", "adjust=inf", "adjust=nan"):
        with pytest.raises(ValueError, match="positive number"):
            run.adjust_rate(wrong)


def base_plan():
    services = run.Services("amqp://bench", "postgresql://bench")
    return run.Plan(services, Path("/nonexistent"), 64, 1, {})


def no_sink():
    msg = "no otlp item here"
    raise AssertionError(msg)


def test_a_variant_with_webhooks_and_adjust_sends_adjustments_to_its_intake():
    plan = run.variant_plan("adjustments 100/s; webhooks; adjust=100", base_plan(), no_sink)
    assert plan.label == "adjustments 100/s"
    assert plan.adjust_per_second == 100
    assert [process.name for process in plan.beside_worker] == ["relay", "webhooks"]
    assert plan.env == {}  # adjust is no setting
    assert run.variant_plan("a; adjust; webhooks", base_plan(), no_sink).adjust_per_second == 100
    assert run.variant_plan("idle; webhooks", base_plan(), no_sink).adjust_per_second == 0
    assert "100 adjustments/s of the 10 hot SKUs" in run._variant_text(plan, base_plan())


def test_a_variant_that_adjusts_without_an_intake_or_at_no_rate_is_refused():
    with pytest.raises(ValueError, match="adjust sends to the intake"):
        run.variant_plan("no intake; adjust=100", base_plan(), no_sink)
    with pytest.raises(ValueError, match=r"'slow; webhooks; adjust=0'.*positive number"):
        run.variant_plan("slow; webhooks; adjust=0", base_plan(), no_sink)


def test_every_result_event_reaches_one_queue_and_the_skus_events_not_the_orders_one():
    assert set(run.SKU_EVENT_KEYS) == {"stock.adjusted", "stock.shortage"}
    assert sorted(run.SKU_EVENT_KEYS + run.ORDER_EVENT_KEYS) == sorted(RESULT_EVENTS)
    assert {"stock.reserved", "stock.rejected"} <= set(run.ORDER_EVENT_KEYS)


def test_the_level_after_a_drain_has_the_orders_units_reserved_and_nothing_else_moved():
    def order(*lines):
        return workload.Order(uuid.uuid4(), uuid.uuid4(), lines)

    before = {"A": (1_000, 0, 0), "B": (1_000, 5, 2), "C": (1_000, 0, 0)}
    orders = [order(("A", 3), ("B", 1)), order(("A", 2))]
    assert run.level_after_drain(before, orders) == {
        "A": (1_000, 5, 0),
        "B": (1_000, 6, 2),
        "C": (1_000, 0, 0),
    }


def drain_with(adjustments):
    return run.Drain(
        kind="worker",
        orders=20_000,
        publish_seconds=1.0,
        rate=2_000.0,
        cpu_per_1000={},
        cpu_per_1000_drain={},
        peak_rss_mib=[],
        outcomes={},
        database_per_order={},
        variant="adjustments 100/s",
        adjustments=adjustments,
    )


def figures_of(answered, checks):
    return run.AdjustmentFigures(
        target_per_second=100,
        sent=1_000,
        sent_per_second=99.7,
        window_per_second=96.4,
        answered=answered,
        skus=("X", "Y"),
        checks=checks,
        answer_ms={"p50": 12.5, "p99": 40.0, "max": 80.25},
    )


def test_the_report_says_the_rate_achieved_and_whether_each_adjustment_applied_once():
    good = figures_of({"204": 1_000}, {"rows": 1_000, "rows_ok": True})
    applied_twice = figures_of({"204": 1_000}, {"rows": 1_001, "rows_ok": False})
    failed = figures_of({"204": 998, "0": 2}, {"rows": 1_000, "rows_ok": True})
    lines = run.adjustment_lines([drain_with(good), drain_with(None), drain_with(applied_twice)])
    assert lines[1] == (
        "adjusted drain 1 (adjustments 100/s): 1,000 `inventory.adjusted` of the 2 hot SKUs"
        " (X, Y) sent at 99.7/s (target 100/s), 96.4/s applied over the counted window;"
        " answers 204: 1,000 in p50 12.5 ms, p99 40.0 ms, max 80.2 ms; each applied once,"
        " its event confirmed, stock exact: yes"
    )
    assert lines[2].endswith("stock exact: **no** (rows)")
    assert good.applied_once
    assert not applied_twice.applied_once
    assert not failed.applied_once
    assert run.adjustment_lines([drain_with(None)]) == []
