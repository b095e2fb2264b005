"""Errors of the PostgreSQL adapter that callers can act on."""

from __future__ import annotations

from collections.abc import Iterable

SKUS_SHOWN = 10
"""SKUs named in the message; ``skus`` holds them all."""


class StockBelowReservedError(ValueError):
    """A new ``on_hand`` would fall below what is already reserved for some SKUs.

    Raised by ``PostgresWarehouse.put_stock`` (and the in-memory fake) before any level is
    changed; the rule is the ``0 <= reserved <= on_hand`` invariant of ``stock_levels``.
    ``skus`` are the offending SKUs, sorted by code point.
    """

    def __init__(self, skus: Iterable[str]) -> None:
        self.skus: tuple[str, ...] = tuple(sorted(skus))
        shown = ", ".join(repr(sku) for sku in self.skus[:SKUS_SHOWN])
        hidden = len(self.skus) - SKUS_SHOWN
        more = f" and {hidden} more" if hidden > 0 else ""
        super().__init__(f"on_hand would fall below reserved units for {shown}{more}")
