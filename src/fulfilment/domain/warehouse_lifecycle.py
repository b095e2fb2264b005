"""What the warehouse's shipments and cancellations do to an order, by the order's state.

The second half of the reservation lifecycle (``fulfilment.domain.lifecycle`` is the first;
docs/design.md, "The reservation lifecycle", has both tables), as plain functions of an
order's state: :func:`apply_shipment` for a ``RecordShipment`` and
:func:`apply_warehouse_cancellation` for a ``RecordWarehouseCancellation``
(``fulfilment.domain.warehouse_events``). An order holds, per SKU, its line less what shipped of
it (:attr:`~fulfilment.domain.lifecycle.OrderState.held`):

=========  ======================================  ===========================================
state now  shipment (``RecordShipment``)           warehouse cancellation
=========  ======================================  ===========================================
no row     ``discrepancy`` (``unknown_order``)     ``discrepancy`` (``unknown_order``)
reserved   ``shipped``: takes per SKU what the     ``released``: gives back per SKU what the
           order holds, never more; the rest is    order holds of the lines (all it holds
           a discrepancy (``more_than_held``, or   without lines); ``reserved`` while it holds
           ``sku_not_held``); ``reserved`` while   units, else ``shipped`` when some shipped,
           it holds units, else ``shipped``;       else ``released``; ``ignored`` when it
           ``discrepancy`` when it takes nothing   holds none of the lines
rejected   ``discrepancy`` (``order_not_reserved``)  ``discrepancy`` (``order_not_reserved``)
released   ``discrepancy`` (``order_not_reserved``)  ``ignored``
shipped    ``already_shipped``                     ``ignored``
cancelled  ``discrepancy`` (``order_not_reserved``)  ``discrepancy`` (``order_not_reserved``)
=========  ======================================  ===========================================

Neither changes a state other than ``reserved``, and neither is dead-lettered: the warehouse
only knows orders the service handed it, so a shipment of an order the service does not hold
is recorded as a discrepancy for an operator (product contract, "Hearing back from the
warehouse"). A cancellation of more than the order holds gives back what it holds, as the
shop's ``OrderCancelled`` does, and is not a discrepancy: the warehouse cancels what it could not
ship, and the order may have shipped the rest meanwhile.

The in-memory stock store of the tests runs these functions; production runs the PL/pgSQL
functions ``record_shipments()`` and ``record_warehouse_cancellations()``, held to the same
answers by the property tests of ``tests/integration/test_postgres_warehouse_lifecycle.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fulfilment.domain.lifecycle import OrderState, OrderStatus
from fulfilment.domain.warehouse_events import (
    Discrepancy,
    DiscrepancyKind,
    ShipmentKind,
    WarehouseCancellationKind,
)


@dataclass(frozen=True, slots=True)
class WarehouseShipment:
    """What :func:`apply_shipment` concluded.

    ``state`` is the order's state after it (None: still no row); ``taken`` the units taken
    from the order per SKU (``on_hand`` and ``reserved`` go down by them); ``unmatched`` the
    units per SKU it named and could not take; ``discrepancies`` the rows to keep for them.
    SKUs are in code-point order.
    """

    kind: ShipmentKind
    state: OrderState | None
    taken: Mapping[str, int] = field(default_factory=dict)
    unmatched: Mapping[str, int] = field(default_factory=dict)
    discrepancies: tuple[Discrepancy, ...] = ()


@dataclass(frozen=True, slots=True)
class WarehouseCancellation:
    """What :func:`apply_warehouse_cancellation` concluded.

    ``state`` is the order's state after it (None: still no row); ``released`` the units per
    SKU given back (``reserved`` goes down by them), in code-point order; ``discrepancies``
    the rows to keep (one per line, or one without SKU for a cancellation of the whole order).
    """

    kind: WarehouseCancellationKind
    state: OrderState | None
    released: Mapping[str, int] = field(default_factory=dict)
    discrepancies: tuple[Discrepancy, ...] = ()


def _named(
    kind: DiscrepancyKind, units: Mapping[str, int] | None, status: OrderStatus | None
) -> tuple[Discrepancy, ...]:
    """One discrepancy per SKU of ``units``, or one without SKU when ``units`` is None."""
    if units is None:
        return (Discrepancy(kind, None, None, status),)
    return tuple(Discrepancy(kind, sku, quantity, status) for sku, quantity in units.items())


def apply_shipment(state: OrderState | None, shipped: Mapping[str, int]) -> WarehouseShipment:
    """Apply a shipment of the warehouse to an order in ``state`` (None: no row).

    Args:
        state: the order's state, or None when the stock store has no row of it.
        shipped: the shipment's units per SKU, merged, in code-point order
            (``RecordShipment.shipped()``); not empty.

    Returns:
        ``already_shipped`` on a ``shipped`` order (nothing changes, nothing is kept: the
        upstream ``OrderShipped`` may have come first). ``discrepancy`` without a row
        (``unknown_order``) or on a rejected, released or tombstoned order
        (``order_not_reserved``), one per SKU. On a ``reserved`` order, per SKU what it holds
        of it, never more; the rest ``more_than_held`` (the excess) when the order has a line
        of the SKU, ``sku_not_held`` (all of it) when not; ``shipped`` when it took any unit,
        the order then ``shipped`` when it holds none, else still ``reserved``;
        ``discrepancy`` when it took none.

    Raises:
        ValueError: ``shipped`` is empty.
    """
    if not shipped:
        msg = "a shipment names at least one line"
        raise ValueError(msg)
    if state is None:
        unknown = _named(DiscrepancyKind.UNKNOWN_ORDER, shipped, None)
        return WarehouseShipment(ShipmentKind.DISCREPANCY, None, {}, dict(shipped), unknown)
    if state.status is OrderStatus.SHIPPED:
        return WarehouseShipment(ShipmentKind.ALREADY_SHIPPED, state)
    if state.status is not OrderStatus.RESERVED:
        refused = _named(DiscrepancyKind.ORDER_NOT_RESERVED, shipped, state.status)
        return WarehouseShipment(ShipmentKind.DISCREPANCY, state, {}, dict(shipped), refused)
    held = state.held
    taken: dict[str, int] = {}
    unmatched: dict[str, int] = {}
    discrepancies: list[Discrepancy] = []
    for sku, units in shipped.items():
        take = min(units, held.get(sku, 0))
        if take:
            taken[sku] = take
        if units > take:
            unmatched[sku] = units - take
            kind = (
                DiscrepancyKind.MORE_THAN_HELD
                if sku in state.lines
                else DiscrepancyKind.SKU_NOT_HELD
            )
            discrepancies.append(Discrepancy(kind, sku, units - take, state.status))
    if not taken:
        return WarehouseShipment(
            ShipmentKind.DISCREPANCY, state, {}, unmatched, tuple(discrepancies)
        )
    return WarehouseShipment(
        ShipmentKind.SHIPPED, state.after_taking(taken), taken, unmatched, tuple(discrepancies)
    )


def apply_warehouse_cancellation(
    state: OrderState | None, cancelled: Mapping[str, int] | None
) -> WarehouseCancellation:
    """Apply a cancellation of the warehouse to an order in ``state`` (None: no row).

    Args:
        state: the order's state, or None when the stock store has no row of it.
        cancelled: units per SKU, merged, in code-point order
            (``RecordWarehouseCancellation.cancelled()``); None: all the order holds.

    Returns:
        ``released`` on a ``reserved`` order that holds some of the lines: per SKU what it
        holds of the line, never what shipped (all it holds without lines); the order then
        ``reserved`` while it holds units, else ``shipped`` when some of it shipped, else
        ``released``. ``ignored`` on a reserved order holding none of the lines, and on a
        shipped or released one (it held stock; it holds none now). ``discrepancy`` without a
        row (``unknown_order``) and on a rejected order or a tombstone, which never held
        stock (``order_not_reserved``).
    """
    if state is None:
        unknown = _named(DiscrepancyKind.UNKNOWN_ORDER, cancelled, None)
        return WarehouseCancellation(WarehouseCancellationKind.DISCREPANCY, None, {}, unknown)
    if state.status in {OrderStatus.REJECTED, OrderStatus.CANCELLED}:
        refused = _named(DiscrepancyKind.ORDER_NOT_RESERVED, cancelled, state.status)
        return WarehouseCancellation(WarehouseCancellationKind.DISCREPANCY, state, {}, refused)
    held = state.held
    given_back = (
        held
        if cancelled is None
        else {sku: min(units, held[sku]) for sku, units in cancelled.items() if sku in held}
    )
    if not given_back:
        return WarehouseCancellation(WarehouseCancellationKind.IGNORED, state)
    return WarehouseCancellation(
        WarehouseCancellationKind.RELEASED, state.after_releasing(given_back), given_back
    )
