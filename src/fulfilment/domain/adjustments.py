"""What an adjustment of the warehouse's stock does to a SKU's level, and the shortage rule.

The product contract ("Hearing back from the warehouse"): an adjustment changes ``on_hand``
by its ``delta``, once per ``adjustment_id``. A SKU the service does not know is created by a
positive delta (as if it stood at 0); a negative delta larger than ``on_hand`` takes it to 0
and the rest is a discrepancy (``more_than_on_hand``). ``reserved`` never changes here, so a
loss may leave ``reserved > on_hand``: the SKU is short by ``reserved - on_hand``
(:attr:`~fulfilment.domain.model.StockLevel.short`), no new reservation takes it
(``decide`` answers ``insufficient_stock``, since nothing is available), and every change of
the shortfall is announced by ``stock.shortage`` until releases or a receipt settle it
(short 0).

The in-memory stock store of the tests runs :func:`apply_adjustment`; production runs
``record_adjustments()`` (``migrations/sql/record_adjustments/``), held to the same answers by
the contract cases and the property tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from fulfilment.domain.model import StockLevel


@dataclass(frozen=True, slots=True)
class Adjusted:
    """What :func:`apply_adjustment` concluded.

    Attributes:
        level: the SKU's level after it; None when the SKU stays unknown (a loss of a SKU
            the service never stocked: no row is created).
        applied: the units ``on_hand`` changed by.
        discrepancy: the units of a loss beyond ``on_hand`` (``applied - delta``), >= 0.
    """

    level: StockLevel | None
    applied: int
    discrepancy: int


def apply_adjustment(level: StockLevel | None, delta: int) -> Adjusted:
    """Apply an adjustment of ``delta`` units to ``level`` (None: the SKU is unknown).

    Returns the level after it, the units applied (``max(delta, -on_hand)``) and the units
    that could not be taken (a discrepancy). A positive delta of an unknown SKU creates it at
    ``delta`` on hand; a negative one leaves it unknown, all of it a discrepancy.

    Raises:
        ValueError: ``delta`` is 0.
    """
    if delta == 0:
        msg = "an adjustment changes on_hand by a non-zero delta"
        raise ValueError(msg)
    if level is None:
        if delta > 0:
            return Adjusted(StockLevel(delta, 0), delta, 0)
        return Adjusted(None, 0, -delta)
    applied = max(delta, -level.on_hand)
    return Adjusted(StockLevel(level.on_hand + applied, level.reserved), applied, applied - delta)


def shortage_changed(before: StockLevel | None, after: StockLevel | None) -> bool:
    """Whether a change from ``before`` to ``after`` changed the SKU's shortfall.

    Every writer of ``stock_levels`` announces such a change with a ``stock.shortage`` event
    (``short`` 0 when it settled); an unknown SKU counts as not short.
    """
    return (0 if before is None else before.short) != (0 if after is None else after.short)
