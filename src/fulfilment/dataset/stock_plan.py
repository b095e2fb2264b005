"""Deterministic stock levels for a set of orders, so that some real orders are turned down.

The plan starts from the total demand per SKU over all the orders (lines of the same SKU
summed) and gives each SKU one of three allocations (:class:`Allocation`), drawn from the SKU
alone:

- ``full``: ``on_hand`` is the whole demand;
- ``short`` (:data:`SHORT_SHARE` of SKUs): ``on_hand`` is half the demand, rounded down (so a
  SKU wanted once is known but has 0 on hand);
- ``absent`` (:data:`ABSENT_SHARE` of SKUs): left out of the plan, unknown to the warehouse.

The draw is the first 8 bytes of the SHA-256 of the SKU's UTF-8 bytes, read as a big-endian
integer and divided by 2**64: the same on every machine and Python version (unlike ``hash``,
which is salted per process), and independent of which files are read, so a SKU that is short
in the sample is short in the full data too. Non-product codes (``POST``, ``DOT``,
``BANK CHARGES``, ...) are planned like any other SKU: the orders carry them as lines.

What this means for the outcomes, whatever the order in which workers take the events:

- an order with an ``absent`` SKU is always rejected with ``unknown_sku``;
- an order whose SKUs are all ``full`` is always reserved, because rejected orders take
  nothing and the stock of a full SKU covers every order that wants it;
- an order with a ``short`` SKU (and no absent one) competes for the last units: for every
  short SKU at least one of its orders is rejected with ``insufficient_stock``, and which ones
  depends on the order of processing. That contest is on purpose: it is what several workers
  on the same hot SKU must get right.

The shares are smaller than "1 % absent, 10 % short" because an order has 12 lines at the
median: with those, a quarter of the December 2010 orders would hit an absent SKU. With the
shares below, the 1,629 orders of December 2010 (2,805 SKUs: 89 short, 9 absent) split, read
in file order by one worker, into 1,358 reserved, 171 ``insufficient_stock`` and 100
``unknown_sku``.
"""

from __future__ import annotations

import csv
import hashlib
import sys
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path

from fulfilment.dataset.files import read_order_files
from fulfilment.dataset.online_retail import (
    OnlineRetailError,
    RetailOrder,
    csv_files,
    read_orders,
)
from fulfilment.domain.model import OrderLine, aggregate_demand
from fulfilment.exit_codes import ExitCode
from fulfilment.tools.command import CommandError, Echo

ABSENT_SHARE = 0.003
"""Share of SKUs (about 3 in 1,000) left out of the plan, so that their orders are rejected
with ``unknown_sku``; about 6 % of the real orders contain one."""

SHORT_SHARE = 0.03
"""Share of SKUs (about 3 in 100) stocked with half their demand, so that some of their orders
are rejected with ``insufficient_stock``; two in five of the real orders contain one."""

STOCK_HEADER = ("sku", "on_hand")
"""The header of a stock file, as ``fulfilment stock load`` reads it (docs/cli.md)."""

_DRAW_BYTES = 8


class Allocation(StrEnum):
    """How much of its demand a SKU gets in the plan (see the module docstring)."""

    FULL = "full"
    SHORT = "short"
    ABSENT = "absent"


def allocation(sku: str) -> Allocation:
    """The allocation of ``sku``, from a stable hash of the SKU alone (see the module docstring).

    The draw in [0, 1) is ``absent`` below :data:`ABSENT_SHARE`, ``short`` below
    ``ABSENT_SHARE + SHORT_SHARE`` and ``full`` above.
    """
    digest = hashlib.sha256(sku.encode()).digest()
    draw = int.from_bytes(digest[:_DRAW_BYTES], "big") / 2 ** (8 * _DRAW_BYTES)
    if draw < ABSENT_SHARE:
        return Allocation.ABSENT
    if draw < ABSENT_SHARE + SHORT_SHARE:
        return Allocation.SHORT
    return Allocation.FULL


def total_demand(orders: Iterable[RetailOrder]) -> dict[str, int]:
    """Units wanted per SKU over all the lines of ``orders``, keys in code-point order."""
    return aggregate_demand(
        OrderLine(sku, quantity) for order in orders for sku, quantity in order.lines
    )


def plan_stock(orders: Iterable[RetailOrder]) -> dict[str, int]:
    """Stock levels for ``orders``: ``{sku: on_hand}``, keys in code-point order.

    Every SKU of the orders is in the result except the ``absent`` ones; ``on_hand`` is the
    SKU's total demand in units, or half of it (rounded down, possibly 0) for ``short`` SKUs.
    The same orders always give the same plan.
    """
    levels: dict[str, int] = {}
    for sku, demand in total_demand(orders).items():
        kind = allocation(sku)
        if kind is Allocation.FULL:
            levels[sku] = demand
        elif kind is Allocation.SHORT:
            levels[sku] = demand // 2
    return levels


def write_stock_csv(levels: Mapping[str, int], path: Path) -> None:
    """Write ``levels`` to ``path`` as a stock file: header ``sku,on_hand``, one row per SKU.

    Rows are sorted by SKU in code-point order, lines end with a line feed, the text is UTF-8,
    and the :mod:`csv` module quotes a SKU only where CSV needs it (a comma or a quote; a space,
    as in ``BANK CHARGES``, needs none). The same levels always give the same bytes.

    Raises:
        ValueError: an ``on_hand`` is negative.
    """
    negative = sorted(sku for sku, units in levels.items() if units < 0)
    if negative:
        msg = f"on_hand must be >= 0; negative for {', '.join(negative)}"
        raise ValueError(msg)
    with path.open("w", encoding="utf-8", newline="") as stream:
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerow(STOCK_HEADER)
        writer.writerows(sorted(levels.items()))


def plan_command(data: Sequence[Path], out: Path, *, echo: Echo) -> None:
    """``fulfilment stock plan``: write the plan of the orders in ``data`` to ``out``.

    Raises:
        CommandError: ``data`` cannot be read, or ``out`` cannot be written (exit 2).
    """
    orders = read_order_files(data).orders
    levels = plan_stock(orders)
    try:
        write_stock_csv(levels, out)
    except OSError as error:
        msg = f"{out}: cannot write: {error.strerror or error}"
        raise CommandError(msg, ExitCode.BAD_INPUT) from error
    echo(f"planned {len(levels)} stock levels for {len(orders)} orders into {out}")


def main(argv: Sequence[str] | None = None) -> int:
    """Write the plan of some Online Retail files: ``SOURCE... STOCK_CSV``.

    Each source is a CSV file or a folder of them. This is how ``data/sample/stock.csv`` is
    made: ``python -m fulfilment.dataset.stock_plan data/sample/online-retail
    data/sample/stock.csv``.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:  # noqa: PLR2004 - at least one source and the output
        sys.stderr.write("usage: python -m fulfilment.dataset.stock_plan SOURCE... STOCK_CSV\n")
        return 2
    *sources, output = args
    try:
        files = [file for source in sources for file in csv_files(Path(source))]
        orders = read_orders(files).orders
    except OnlineRetailError as error:
        sys.stderr.write(f"{error}\n")
        return 1
    levels = plan_stock(orders)
    write_stock_csv(levels, Path(output))
    kinds = [allocation(sku) for sku in total_demand(orders)]
    sys.stdout.write(
        f"{output}: {len(levels)} SKUs, {kinds.count(Allocation.SHORT)} short,"
        f" {kinds.count(Allocation.ABSENT)} absent, from {len(orders)} orders\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
