"""The drift between the service's stock and the warehouse's: the rule, and the two reads.

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
explain: the check does not ask the warehouse about each order (that is the dispatcher's
poll), so while orders are in flight a real drift of up to ``in_flight`` units waits for them
to ship before it shows. The service is read first (one snapshot), the warehouse after: a
shipment made between the two reads shows as a difference its order explains, never as an
unexplained one. An adjustment the warehouse made but the service has not recorded yet (its
webhook is still being retried) is unexplained until it arrives: the next check clears it.

Two programs compare with :func:`read_drift`: ``fulfilment stock drift`` (once, on demand) and
the active dispatcher (every ``FULFILMENT_WAREHOUSE_DRIFT_INTERVAL_SECONDS``, for its gauges).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from fulfilment.adapters.postgres.stock_drift import (
    HeldAtTheWarehouse,
    ServiceStock,
    service_stock,
)
from fulfilment.adapters.warehouse.inventory import WarehouseInventory, read_inventory


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


async def read_drift(
    engine: AsyncEngine,
    http: httpx.AsyncClient,
    gate: AbstractAsyncContextManager[object],
    *,
    timeout_seconds: float,
) -> DriftReport:
    """Read the service's stock (one snapshot), then the warehouse's inventory; compare them.

    Args:
        engine: the service's database.
        http: the warehouse client's pooled client (base URL, token, CA, timeouts).
        gate: entered around each request to the warehouse (``read_inventory``'s): the rate
            cap, or the dispatcher's gates.
        timeout_seconds: one request's bound.

    Raises:
        InventoryUnavailableError: the warehouse did not answer (5xx, timeouts, 429s).
        InventoryRefusedError: the warehouse refused the credentials (401, 403).
        InventoryReadError: the warehouse answered something that is no inventory.
        sqlalchemy.exc.DBAPIError: the database failed.
        OSError: the database cannot be reached.
    """
    service = await service_stock(engine)
    warehouse = await read_inventory(http, gate, timeout_seconds=timeout_seconds)
    return compare(service, warehouse)
