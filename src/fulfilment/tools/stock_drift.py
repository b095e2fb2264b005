"""``fulfilment stock drift``: the warehouse's on hand beside the service's; changes nothing.

The rule (docs/runbook.md, "Stock drifts from the warehouse"): a SKU's **difference** is the
service's ``stock_levels.on_hand`` minus the warehouse's ``on_hand`` (``GET {base}/inventory``). The
warehouse takes a shipment's units off its shelf when the shipment leaves; the service takes
them when it records the shipment (its webhook, or the dispatcher's poll). In between, the
service's on hand is higher by units that the shipped orders still hold in the service, and
those orders are reserved ones whose fulfilment order the warehouse has (``accepted``, or
``sending``: sent, its answer not recorded yet). So, with ``in_flight`` the units of the SKU
that such orders hold:

- ``agrees``: difference 0;
- ``in_flight``: 0 < difference <= in_flight: the warehouse may have shipped that many of
  those orders' units and the service not heard yet; the orders are named, and the difference
  goes once their shipments are recorded;
- ``unexplained``: difference < 0 (the warehouse has more than the service: a receipt, return
  or find not heard of, or the shop's ``OrderShipped`` ahead of the warehouse's shipment), or
  difference > in_flight (units gone that no order accounts for: a damage, loss or count not
  heard of, or an operator's ``stock adjust`` the warehouse did not make).

A SKU one side does not list counts as 0 on hand there. The bound is the most the orders can
explain: the command does not ask the warehouse about each order (that is the dispatcher's
poll), so while orders are in flight a real drift of up to ``in_flight`` units waits for them
to ship before it shows. The service is read first (one snapshot), the warehouse after: a
shipment made between the two reads shows as a difference its order explains, never as an
unexplained one. An adjustment the warehouse made but the service has not recorded yet (its
webhook is still being retried) is unexplained until it arrives: run the command again.

Exit 0 when no SKU is unexplained, 1 (after the report) when one is.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import httpx
from aiolimiter import AsyncLimiter

from fulfilment.adapters.postgres.admin import stock_session
from fulfilment.adapters.postgres.stock_drift import (
    HeldAtTheWarehouse,
    ServiceStock,
    service_stock,
)
from fulfilment.adapters.warehouse.inventory import (
    InventoryReadError,
    InventoryRefusedError,
    InventoryUnavailableError,
    WarehouseInventory,
    read_inventory,
)
from fulfilment.exit_codes import ExitCode
from fulfilment.tools.command import CommandError, Echo, ToolOptions

ORDERS_SHOWN = 5
"""Orders named per SKU in the text report (``--json`` names them all)."""


class DriftState(StrEnum):
    """How a SKU's two counts compare (the module's rule)."""

    AGREES = "agrees"
    IN_FLIGHT = "in_flight"
    UNEXPLAINED = "unexplained"


@dataclass(frozen=True, slots=True)
class SkuDrift:
    """One SKU's two counts.

    Attributes:
        sku: the SKU.
        warehouse_on_hand: the warehouse's (0 when it does not list the SKU).
        service_on_hand: ``stock_levels.on_hand`` (0 when the service has no row).
        difference: ``service_on_hand - warehouse_on_hand``.
        in_flight: units of the SKU held by orders whose fulfilment order the warehouse has.
        state: :class:`DriftState` by the module's rule.
        orders: those orders (``in_flight`` is the sum of their units).
        listed_by_warehouse: whether the warehouse's inventory lists the SKU.
        known_to_service: whether ``stock_levels`` has a row of it.
    """

    sku: str
    warehouse_on_hand: int
    service_on_hand: int
    difference: int
    in_flight: int
    state: DriftState
    orders: tuple[HeldAtTheWarehouse, ...]
    listed_by_warehouse: bool
    known_to_service: bool


@dataclass(frozen=True, slots=True)
class DriftReport:
    """Every SKU either side lists, compared; ``as_of`` is the warehouse's first page's."""

    as_of: datetime
    skus: tuple[SkuDrift, ...]

    def count(self, state: DriftState) -> int:
        """SKUs in ``state``."""
        return sum(1 for sku in self.skus if sku.state is state)

    @property
    def differing(self) -> list[SkuDrift]:
        """The SKUs whose counts differ, in SKU order."""
        return [sku for sku in self.skus if sku.state is not DriftState.AGREES]


def compare(service: ServiceStock, warehouse: WarehouseInventory) -> DriftReport:
    """Every SKU of either side with its :class:`DriftState` by the module's rule."""
    skus = sorted(service.on_hand.keys() | warehouse.on_hand.keys())
    compared = []
    for sku in skus:
        orders = tuple(service.held.get(sku, ()))
        in_flight = sum(order.units for order in orders)
        difference = service.on_hand.get(sku, 0) - warehouse.on_hand.get(sku, 0)
        if difference == 0:
            state = DriftState.AGREES
        elif 0 < difference <= in_flight:
            state = DriftState.IN_FLIGHT
        else:
            state = DriftState.UNEXPLAINED
        compared.append(
            SkuDrift(
                sku=sku,
                warehouse_on_hand=warehouse.on_hand.get(sku, 0),
                service_on_hand=service.on_hand.get(sku, 0),
                difference=difference,
                in_flight=in_flight,
                state=state,
                orders=orders,
                listed_by_warehouse=sku in warehouse.on_hand,
                known_to_service=sku in service.on_hand,
            )
        )
    return DriftReport(as_of=warehouse.as_of, skus=tuple(compared))


async def drift_command(  # noqa: PLR0913 - the two sides' means, and the output's
    options: ToolOptions,
    http: httpx.AsyncClient,
    limiter: AsyncLimiter,
    *,
    timeout_seconds: float,
    as_json: bool,
    echo: Echo,
) -> DriftReport:
    """``fulfilment stock drift``: read both sides, print the SKUs that differ and a summary.

    Args:
        options: where PostgreSQL is.
        http: the warehouse client's pooled client (base URL, token, CA, timeouts).
        limiter: the warehouse's rate cap, one token per request.
        timeout_seconds: one request's bound.
        as_json: one JSON document (:func:`report_document`) instead of the text.
        echo: standard output.

    Raises:
        CommandError: a SKU is ``unexplained`` (exit 1, after the report); the warehouse does
            not answer (exit 3), refuses the credentials (exit 4) or answers something that is
            no inventory (exit 1).
        DatabaseUnavailableError: PostgreSQL does not answer.
    """
    async with stock_session(options.database, consumer=options.consumer) as stock:
        service = await service_stock(stock.engine)
    try:
        warehouse = await read_inventory(http, limiter, timeout_seconds=timeout_seconds)
    except InventoryUnavailableError as error:
        raise CommandError(str(error), ExitCode.UNAVAILABLE) from error
    except InventoryRefusedError as error:
        raise CommandError(str(error), ExitCode.REFUSED) from error
    except InventoryReadError as error:
        raise CommandError(str(error)) from error
    report = compare(service, warehouse)
    if as_json:
        echo(json.dumps(report_document(report), indent=2))
    else:
        for line in render_report(report):
            echo(line)
    unexplained = report.count(DriftState.UNEXPLAINED)
    if unexplained:
        names = ", ".join(
            sku.sku for sku in report.differing if sku.state is DriftState.UNEXPLAINED
        )
        msg = f"{unexplained} SKU(s) differ from the warehouse beyond the orders in flight: {names}"
        raise CommandError(msg)
    return report


def report_document(report: DriftReport) -> dict[str, Any]:
    """The report as JSON: ``as_of``, the counts by state, and every SKU that differs."""
    return {
        "as_of": report.as_of.isoformat(),
        "compared": len(report.skus),
        **{state.value: report.count(state) for state in DriftState},
        "skus": [_sku_document(sku) for sku in report.differing],
    }


def _sku_document(sku: SkuDrift) -> dict[str, Any]:
    document = asdict(sku)
    document["state"] = sku.state.value
    document["orders"] = [
        {**asdict(order), "order_id": str(order.order_id)} for order in sku.orders
    ]
    return document


def render_report(report: DriftReport) -> Sequence[str]:
    """The text report: one line per SKU that differs, then the summary line."""
    lines = []
    differing = report.differing
    if differing:
        lines.append(
            f"{'SKU':<20}  {'WAREHOUSE':>9}  {'SERVICE':>9}  {'DIFF':>6}  {'IN FLIGHT':>9}"
            f"  {'STATE':<11}  ORDERS (warehouse id, units held)"
        )
    for sku in differing:
        shown = ", ".join(
            f"{order.order_id} ({order.warehouse_id or order.status}, {order.units})"
            for order in sku.orders[:ORDERS_SHOWN]
        )
        if len(sku.orders) > ORDERS_SHOWN:
            shown += f", and {len(sku.orders) - ORDERS_SHOWN} more"
        lines.append(
            f"{sku.sku:<20}  {sku.warehouse_on_hand:>9}  {sku.service_on_hand:>9}"
            f"  {sku.difference:>+6}  {sku.in_flight:>9}  {sku.state.value:<11}  {shown or '-'}"
        )
    lines.append(
        f"{len(report.skus)} SKU(s) compared with the warehouse's inventory as of"
        f" {report.as_of.isoformat()}: {report.count(DriftState.AGREES)} agree,"
        f" {report.count(DriftState.IN_FLIGHT)} differ by units of orders in flight,"
        f" {report.count(DriftState.UNEXPLAINED)} unexplained"
    )
    return lines
