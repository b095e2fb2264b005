"""The stock of each SKU replayed from the outbox, to judge every change of it at the moment
it committed.

Every writer of ``stock_levels`` locks the rows of the SKUs it changes before it writes its
result events, and keeps the locks until it commits; ``outbox.id`` is taken from a sequence
when a row is inserted. So the rows about one SKU (its ``stock.adjusted`` and
``stock.shortage``, and every ``stock.reserved``, ``stock.released`` and ``stock.shipped``
with a line of it) are in ``outbox.id`` order in the order their transactions changed the
SKU, and a transaction's rows about it are next to each other (they share ``created_at``, the
transaction's ``now()``). Replaying them from the loaded levels gives ``on_hand`` and
``reserved`` before and after each change, which is what a reservation from a short SKU, or a
result event that misstates the levels, is judged by. The replay's end is checked against
``stock_levels`` by the caller: a change without its event, or an event without its change,
shows there.

A ``stock.shortage`` is written by the trigger of ``stock_levels`` when an update changed the
shortfall, so before the result event of the change in its transaction: it is matched to the
levels after one of the changes that follow it in that transaction, each shortage to a later
change than the one before it.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

CHANGES = frozenset({"stock.reserved", "stock.released", "stock.shipped", "stock.adjusted"})
"""The result events that change a SKU's levels."""


@dataclass(frozen=True)
class OutboxRow:
    """One row of ``outbox``, as the replay reads it.

    ``body``: the decoded JSON; ``created_at``: its transaction's ``now()``.
    """

    id: int
    event_id: str
    routing_key: str
    sku: str | None
    body: Mapping[str, Any]
    created_at: datetime

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> OutboxRow:
        """From a row of ``SELECT id, event_id, routing_key, sku, body::text AS body,
        created_at FROM outbox``."""
        return cls(
            id=int(record["id"]),
            event_id=str(record["event_id"]),
            routing_key=str(record["routing_key"]),
            sku=record["sku"],
            body=json.loads(record["body"]),
            created_at=record["created_at"],
        )

    def units(self) -> dict[str, int]:
        """The SKUs this row is about, with its units of each (0 for a SKU it names without
        units: a rejection's SKUs, a SKU event's own)."""
        if self.sku is not None:
            return {self.sku: 0}
        if self.routing_key == "stock.rejected":
            return dict.fromkeys(self.body["skus"], 0)
        return {line["sku"]: int(line["quantity"]) for line in self.body.get("lines") or ()}


@dataclass
class StockReplay:
    """What the replay found.

    Attributes:
        levels: ``(on_hand, reserved)`` per SKU at the end of the outbox.
        reserved_from_short: ``event_id`` of every ``stock.reserved`` that took a unit of a
            SKU short before it, or left one short (``reserved > on_hand`` after it): the
            service never reserves beyond ``on_hand``.
        rejected_while_short: ``event_id`` of every ``stock.rejected`` naming a SKU that was
            short when it was written.
        shipped_beyond_on_hand: units per SKU that shipments took of ``reserved`` beyond
            ``on_hand`` (a short SKU's shipment takes ``on_hand`` to 0, never below).
        adjusted_wrong: ``event_id`` of every ``stock.adjusted`` whose ``applied`` is not
            ``max(delta, -on_hand)`` of the levels before it, or whose ``on_hand``,
            ``reserved`` or ``available`` are not the levels after it.
        shortage_wrong: ``stock.shortage`` events that match no levels after a change that
            follows them in their transaction (or whose ``short`` is not ``reserved -
            on_hand`` of their own body), and transactions that changed a SKU's shortfall
            without one, or whose last one does not give the shortfall they left.
        short_spells: times a SKU went from not short to short.
    """

    levels: dict[str, tuple[int, int]] = field(default_factory=dict)
    reserved_from_short: set[str] = field(default_factory=set)
    rejected_while_short: set[str] = field(default_factory=set)
    shipped_beyond_on_hand: Counter[str] = field(default_factory=Counter)
    adjusted_wrong: set[str] = field(default_factory=set)
    shortage_wrong: int = 0
    short_spells: int = 0


def replay_stock(rows: Iterable[OutboxRow], loaded: Mapping[str, int]) -> StockReplay:
    """Replay ``rows`` (the whole outbox, in ``id`` order) per SKU from ``loaded`` (the
    units on hand before the first row; a SKU not in it starts at 0, as a receipt creates
    it) with nothing reserved."""
    by_sku: dict[str, list[tuple[OutboxRow, int]]] = defaultdict(list)
    for row in sorted(rows, key=lambda row: row.id):
        for sku, units in row.units().items():
            by_sku[sku].append((row, units))
    replay = StockReplay()
    for sku, changes in by_sku.items():
        level = _Level(loaded.get(sku, 0), 0)
        for transaction in _transactions(changes):
            _replay_transaction(sku, transaction, level, replay)
        replay.levels[sku] = (level.on_hand, level.reserved)
    return replay


@dataclass
class _Level:
    on_hand: int
    reserved: int

    @property
    def short(self) -> int:
        return max(0, self.reserved - self.on_hand)


def _transactions(
    changes: list[tuple[OutboxRow, int]],
) -> list[list[tuple[OutboxRow, int]]]:
    """``changes`` of one SKU cut where ``created_at`` changes: one list per transaction."""
    cut: list[list[tuple[OutboxRow, int]]] = []
    for change in changes:
        if cut and cut[-1][-1][0].created_at == change[0].created_at:
            cut[-1].append(change)
        else:
            cut.append([change])
    return cut


def _replay_transaction(
    sku: str, transaction: list[tuple[OutboxRow, int]], level: _Level, replay: StockReplay
) -> None:
    """Apply one transaction's rows about ``sku`` to ``level``, judging each."""
    short_before = level.short
    after: list[tuple[int, int]] = []
    """The levels after each change of the transaction, in order."""
    shortages: list[tuple[int, Mapping[str, Any]]] = []
    """Each stock.shortage, with the changes written before it in the transaction."""
    for row, units in transaction:
        if row.routing_key == "stock.shortage":
            shortages.append((len(after), row.body))
        elif row.routing_key == "stock.rejected":
            if level.short:
                replay.rejected_while_short.add(row.event_id)
        elif row.routing_key in CHANGES:
            _apply(sku, row, units, level, replay)
            after.append((level.on_hand, level.reserved))
    replay.shortage_wrong += _shortages_wrong(shortages, after)
    if shortages and int(shortages[-1][1]["short"]) != level.short:
        replay.shortage_wrong += 1
    if not shortages and level.short != short_before:
        replay.shortage_wrong += 1
    if level.short and not short_before:
        replay.short_spells += 1


def _apply(sku: str, row: OutboxRow, units: int, level: _Level, replay: StockReplay) -> None:
    """Apply one change of ``sku`` (``units`` of it) to ``level``, judging it."""
    body = row.body
    was_short = level.short > 0
    if row.routing_key == "stock.reserved":
        level.reserved += units
        if was_short or level.short:
            replay.reserved_from_short.add(row.event_id)
    elif row.routing_key == "stock.released":
        level.reserved -= units
    elif row.routing_key == "stock.shipped":
        replay.shipped_beyond_on_hand[sku] += max(0, units - level.on_hand)
        level.on_hand = max(0, level.on_hand - units)
        level.reserved -= units
    else:
        if int(body["applied"]) != max(int(body["delta"]), -level.on_hand):
            replay.adjusted_wrong.add(row.event_id)
        level.on_hand += int(body["applied"])
        stated = (int(body["on_hand"]), int(body["reserved"]), int(body["available"]))
        if stated != (level.on_hand, level.reserved, max(0, level.on_hand - level.reserved)):
            replay.adjusted_wrong.add(row.event_id)


def _shortages_wrong(
    shortages: list[tuple[int, Mapping[str, Any]]], after: list[tuple[int, int]]
) -> int:
    """The shortages that match no levels ``after`` a later change than the previous one's
    match, at or after the changes written before them."""
    wrong = 0
    matched = -1
    for written_after, body in shortages:
        stated = (int(body["on_hand"]), int(body["reserved"]))
        if int(body["short"]) != max(0, stated[1] - stated[0]):
            wrong += 1
            continue
        candidates = [
            index
            for index in range(max(written_after, matched + 1), len(after))
            if after[index] == stated
        ]
        if candidates:
            matched = candidates[0]
        else:
            wrong += 1
    return wrong
