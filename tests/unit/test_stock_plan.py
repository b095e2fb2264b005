from __future__ import annotations

import csv
import hashlib
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from fulfilment.dataset.online_retail import (
    RetailOrder,
    csv_files,
    event_id_for,
    order_id_for,
    read_orders,
)
from fulfilment.dataset.stock_plan import (
    ABSENT_SHARE,
    SHORT_SHARE,
    Allocation,
    allocation,
    main,
    plan_stock,
    total_demand,
    write_stock_csv,
)
from fulfilment.domain.model import OrderLine, RejectionReason, StockLevel, aggregate_demand, decide

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample"
SAMPLE_ORDERS = SAMPLE / "online-retail"
SAMPLE_STOCK = SAMPLE / "stock.csv"
# Real SKUs of the sample, one per allocation (the pinned values also guard the hash rule).
FULL_SKU, SHORT_SKU, ABSENT_SKU = "85123A", "20759", "22117"


def order(number: str, *lines: tuple[str, int]) -> RetailOrder:
    return RetailOrder(
        invoice_no=number,
        event_id=event_id_for(number),
        order_id=order_id_for(number),
        placed_at=datetime(2010, 12, 1, 8, 26, tzinfo=ZoneInfo("Europe/London")),
        lines=lines,
        source=f"test.csv:{number}",
        day="test",
        customer=None,
    )


def read_stock(path: Path) -> dict[str, int]:
    with path.open(newline="", encoding="utf-8") as stream:
        return {row["sku"]: int(row["on_hand"]) for row in csv.DictReader(stream)}


def test_the_example_skus_fall_in_their_bands():
    assert allocation(FULL_SKU) is Allocation.FULL
    assert allocation(SHORT_SKU) is Allocation.SHORT
    assert allocation(ABSENT_SKU) is Allocation.ABSENT


def test_the_allocation_is_the_sha256_draw_of_the_sku():
    for sku in ["85123A", "BANK CHARGES", "gift_0001_40", "15056bl", SHORT_SKU, ABSENT_SKU]:
        draw = int.from_bytes(hashlib.sha256(sku.encode()).digest()[:8], "big") / 2**64
        expected = (
            Allocation.ABSENT
            if draw < ABSENT_SHARE
            else Allocation.SHORT
            if draw < ABSENT_SHARE + SHORT_SHARE
            else Allocation.FULL
        )
        assert allocation(sku) is expected


def test_the_allocation_is_the_same_in_another_interpreter():
    # A fresh process has another string-hash salt: a plan built on hash() would differ.
    skus = ["85123A", SHORT_SKU, ABSENT_SKU, "POST"]
    code = (
        "from fulfilment.dataset.stock_plan import allocation;"
        f"print(','.join(allocation(s) for s in {skus!r}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    ).stdout.strip()

    assert out == ",".join(allocation(s) for s in skus)


def test_the_shares_of_short_and_absent_skus_are_about_the_documented_ones():
    kinds = [allocation(f"SKU{n}") for n in range(20_000)]

    assert kinds.count(Allocation.ABSENT) / len(kinds) == pytest.approx(ABSENT_SHARE, abs=0.0015)
    assert kinds.count(Allocation.SHORT) / len(kinds) == pytest.approx(SHORT_SHARE, abs=0.005)


def test_full_skus_get_their_total_demand_short_ones_half_and_absent_ones_nothing():
    orders = [
        order("1", (FULL_SKU, 6), (SHORT_SKU, 3), (FULL_SKU, 4)),
        order("2", (SHORT_SKU, 4), (ABSENT_SKU, 1)),
    ]

    assert total_demand(orders) == {ABSENT_SKU: 1, SHORT_SKU: 7, FULL_SKU: 10}
    assert plan_stock(orders) == {SHORT_SKU: 3, FULL_SKU: 10}


def test_a_short_sku_wanted_once_is_known_with_nothing_on_hand():
    assert plan_stock([order("1", (SHORT_SKU, 1))]) == {SHORT_SKU: 0}


def test_the_same_orders_always_give_the_same_plan():
    orders = read_orders(csv_files(SAMPLE_ORDERS)).orders

    assert plan_stock(orders) == plan_stock(list(reversed(orders)))
    assert list(plan_stock(orders)) == sorted(plan_stock(orders))


def test_the_sample_plan_has_short_and_absent_skus_that_reject_real_orders():
    orders = read_orders(csv_files(SAMPLE_ORDERS)).orders
    levels = plan_stock(orders)
    demand = total_demand(orders)

    absent = [sku for sku in demand if sku not in levels]
    short = [sku for sku, units in levels.items() if units < demand[sku]]
    assert absent
    assert short
    assert all(allocation(sku) is Allocation.ABSENT for sku in absent)
    assert all(allocation(sku) is Allocation.SHORT for sku in short)

    # One worker taking the orders in file order: every kind of outcome happens.
    stock = {sku: StockLevel(units) for sku, units in levels.items()}
    reasons = []
    for placed in orders:
        wanted = aggregate_demand(OrderLine(sku, units) for sku, units in placed.lines)
        decision = decide(wanted, {sku: stock[sku] for sku in wanted if sku in stock})
        reasons.append(decision.reason)
        if decision.reason is None:
            for sku, units in wanted.items():
                stock[sku] = StockLevel(stock[sku].on_hand, stock[sku].reserved + units)
    assert reasons.count(RejectionReason.UNKNOWN_SKU) > 0
    assert reasons.count(RejectionReason.INSUFFICIENT_STOCK) > 0
    assert reasons.count(None) > len(orders) / 2


def test_a_stock_file_round_trips_through_the_csv_module(tmp_path):
    levels = {"BANK CHARGES": 1, "POST": 8, "85123A": 6, "85123a": 0, "ODD,CODE": 2, 'SAY "HI"': 3}
    path = tmp_path / "stock.csv"

    write_stock_csv(levels, path)

    assert read_stock(path) == levels
    assert path.read_text(encoding="utf-8") == (
        'sku,on_hand\n85123A,6\n85123a,0\nBANK CHARGES,1\n"ODD,CODE",2\nPOST,8\n"SAY ""HI""",3\n'
    )


def test_a_negative_level_is_refused(tmp_path):
    with pytest.raises(ValueError, match="negative for POST"):
        write_stock_csv({"POST": -1, "85123A": 6}, tmp_path / "stock.csv")


def test_the_committed_sample_stock_is_what_the_plan_gives_byte_for_byte(tmp_path):
    regenerated = tmp_path / "stock.csv"

    write_stock_csv(plan_stock(read_orders(csv_files(SAMPLE_ORDERS)).orders), regenerated)

    assert regenerated.read_bytes() == SAMPLE_STOCK.read_bytes(), (
        "data/sample/stock.csv is stale; regenerate it with: uv run python -m"
        " fulfilment.dataset.stock_plan data/sample/online-retail data/sample/stock.csv"
    )


def test_main_writes_the_plan_of_a_folder(tmp_path, capsys):
    output = tmp_path / "stock.csv"

    assert main([str(SAMPLE_ORDERS), str(output)]) == 0

    assert output.read_bytes() == SAMPLE_STOCK.read_bytes()
    assert capsys.readouterr().out.startswith(f"{output}: ")


def test_main_reports_bad_input_in_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "missing"), str(tmp_path / "stock.csv")]) == 1

    assert capsys.readouterr().err == f"{tmp_path / 'missing'}: no such file or folder\n"


def test_main_without_an_output_prints_its_usage(capsys):
    assert main([]) == 2

    assert capsys.readouterr().err.startswith("usage:")
