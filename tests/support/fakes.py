"""Hand-written fakes of the application's ports, for tests of the layers above them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

from fulfilment.adapters.postgres.errors import StockBelowReservedError
from fulfilment.application.ports import OutcomeT, Stock, WarehouseRequests
from fulfilment.contracts.warehouse_bodies import request_body
from fulfilment.domain.adjustments import shortage_changed
from fulfilment.domain.handoff import (
    OPEN_STATUSES,
    Accepted,
    Answer,
    CredentialsRefused,
    HandoffCancellation,
    RateLimited,
    Refused,
    RequestBacklog,
    RequestKind,
    RequestRecord,
    RequestStatus,
    Retry,
    WarehouseRequest,
    cancel_with_handoff,
    cancellation_accepted,
    cancellation_refused,
    cancellation_to_send,
    fulfilment_order_failed,
)
from fulfilment.domain.lifecycle import (
    CancelKind,
    Cancellation,
    CancelOrder,
    CancelOutcome,
    OrderState,
    OrderStatus,
    ShipKind,
    ShipOrder,
    ShipOutcome,
    Tombstone,
    apply_cancelled,
    apply_placed,
    apply_shipped,
    as_lines,
    released,
    shipped,
)
from fulfilment.domain.model import (
    Command,
    DuplicateOf,
    OrderLine,
    OutcomeKind,
    PlaceOrder,
    RejectionReason,
    ReservationOutcome,
    StockLevel,
    aggregate_demand,
)
from fulfilment.domain.warehouse_events import (
    RecordAdjustment,
    RecordShipment,
    RecordWarehouseCancellation,
)
from fulfilment.observability.tracing import current_traceparent
from tests.support.fake_warehouse_events import WarehouseEventsInMemory

CANCEL_INBOX_OUTCOMES = {
    CancelKind.RELEASED: "released",
    CancelKind.PARTIALLY_RELEASED: "partially_released",
    CancelKind.TOMBSTONED: "tombstoned",
    CancelKind.IGNORED: "cancel_ignored",
    CancelKind.CANCEL_AFTER_SHIP: "cancel_after_ship",
    CancelKind.CANCEL_REQUESTED: "cancel_requested",
}
"""The ``inbox_messages.outcome`` of each recorded cancel, as ``cancel_orders()`` writes it."""

SHIP_INBOX_OUTCOMES = {ShipKind.SHIPPED: "shipped", ShipKind.IGNORED: "ship_ignored"}
"""The ``inbox_messages.outcome`` of each recorded shipment, as ``ship_orders()`` writes it
(``not_reserved`` is not recorded)."""


UPSTREAM_SHIPMENT: Mapping[str, Any] = {
    "shipment_id": None,
    "carrier": None,
    "tracking_numbers": [],
    "tracking_url": None,
}
"""The fields of a warehouse's shipment in the ``stock.shipped`` of an upstream ``OrderShipped``,
which has none of them."""

SHOP_RELEASE: Mapping[str, Any] = {"reason": "cancelled", "warehouse_reason": None}
"""The ``reason`` fields of a ``stock.released`` that the shop's ``OrderCancelled`` caused."""


@dataclass(frozen=True)
class RecordedEvent:
    """A result event as the outbox holds it, less what is minted with the row.

    ``body`` is the message without ``event_id`` and ``occurred_at`` (a new UUID and the
    transaction's time, which no two stock stores share); ``traceparent`` the trace context of
    the span current when it was written (the delivery's).
    """

    routing_key: str
    body: Mapping[str, Any]
    traceparent: str | None = None

    @property
    def order_id(self) -> str:
        """The ``order_id`` of the body; ``""`` for an event about a SKU (``stock.adjusted``,
        ``stock.shortage``), which names none."""
        return str(self.body.get("order_id", ""))


class ShortageWatchingLevels(dict[str, StockLevel]):
    """``FakeStock.levels``: every write that changes a SKU's shortfall records
    ``stock.shortage``, as the trigger of ``stock_levels`` does (migration 0016), whichever
    rule wrote it."""

    def __init__(self, stock: FakeStock) -> None:
        super().__init__()
        self._stock = stock

    def __setitem__(self, sku: str, level: StockLevel) -> None:
        before = self.get(sku)
        super().__setitem__(sku, level)
        if before is not None and shortage_changed(before, level):
            self._stock.record_sku_result(
                "stock.shortage",
                sku=sku,
                on_hand=level.on_hand,
                reserved=level.reserved,
                short=level.short,
            )


ResultCause = PlaceOrder | CancelOrder | ShipOrder | RecordShipment | RecordWarehouseCancellation
"""The commands that write result events."""


def result_body(command: ResultCause, **fields: Any) -> dict[str, Any]:
    """The body of the result event ``command`` caused, less ``event_id`` and ``occurred_at``.

    ``fields`` are its kind's own (``lines`` as order lines, ``reason``, ``skus``,
    ``order_status``, a shipment's ``shipment_id``, ``carrier``, ...), as the product
    contract's "Result events" gives them.
    """
    body: dict[str, Any] = {
        "version": 1,
        "causation_id": str(command.event_id),
        "order_id": str(command.order_id),
    }
    for name, value in fields.items():
        body[name] = (
            [{"sku": line.sku, "quantity": line.quantity} for line in value]
            if name == "lines"
            else value
        )
    return body


@dataclass(frozen=True)
class Reservation:
    """What the fake keeps per order, like a row of ``reservations`` with its lines.

    ``event_id`` is the event that placed the order (None for a tombstone); ``lines`` are its
    ``reservation_lines`` (``quantity``: units held and shipped) and ``shipped`` their
    ``shipped`` column (SKUs with none left out); ``tombstone`` is what cancels said before it
    was placed.
    """

    event_id: UUID | None
    reason: RejectionReason | None
    skus: tuple[str, ...]
    lines: dict[str, int] = field(default_factory=dict)
    status: OrderStatus = OrderStatus.RESERVED
    tombstone: Tombstone | None = None
    shipped: dict[str, int] = field(default_factory=dict)

    @property
    def state(self) -> OrderState:
        """The order's state, as the lifecycle's transition functions take it."""
        return OrderState(self.status, self.lines, self.tombstone, self.shipped)

    def after(self, state: OrderState) -> Reservation:
        """This row once the order is in ``state`` (placement, reason and SKUs kept)."""
        return Reservation(
            self.event_id,
            self.reason,
            self.skus,
            dict(state.lines),
            state.status,
            state.tombstone,
            dict(state.shipped),
        )


@dataclass
class StoredRequest:
    """What the fake keeps per warehouse request, like a row of ``warehouse_requests``.

    ``lines`` are units per SKU in code-point order (None: a cancellation of the whole
    order); times are timezone-aware (the fake's clock is the wall clock, as ``now()`` is).
    ``released_order`` marks the cancellation whose application left its order released;
    ``news_at`` the last time a shipment or cancellation of the warehouse was recorded for a
    fulfilment order's order.
    """

    id: int
    idempotency_key: UUID
    kind: RequestKind
    order_id: UUID
    causation_id: UUID
    lines: dict[str, int] | None
    traceparent: str | None
    created_at: datetime
    status: RequestStatus = RequestStatus.PENDING
    body: bytes | None = None
    attempts: int = 0
    next_attempt_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    first_attempt_at: datetime | None = None
    last_attempt_at: datetime | None = None
    answered_at: datetime | None = None
    warehouse_id: str | None = None
    last_status_code: int | None = None
    last_answer: str | None = None
    released_order: bool = False
    news_at: datetime | None = None


class FakeStock(Stock):
    """The ``Stock`` in memory, with the rules of ``PostgresStock``.

    An inbox keyed on ``(consumer, event_id)`` makes every event idempotent, an order placed by
    one event is a ``duplicate`` of ``order`` under any other, and one lock serialises the calls
    the way the database's row locks do. ``inbox`` maps each key to its outcome label
    (``reserved``, ``rejected``, ``duplicate_order``, and those of
    :data:`CANCEL_INBOX_OUTCOMES` and :data:`SHIP_INBOX_OUTCOMES`, as the database's column
    does). Every transition is the one of ``fulfilment.domain.lifecycle``. ``result_events``
    lists the result events in the order they were written, as the functions write them to the
    outbox: one per change of a reservation's status and per partial release, none for a
    tombstone, a duplicate or an event that changes nothing.

    With ``handoff=True`` it records the requests to the warehouse system in ``requests`` (in
    ``id`` order) and defers cancels as ``fulfilment.domain.handoff`` says, as
    ``PostgresStock(..., handoff=True)`` does. ``warehouse`` keeps what the warehouse's own
    shipments and cancellations recorded (:class:`WarehouseEventsInMemory`).
    """

    def __init__(self, *, consumer: str = "fulfilment", handoff: bool = False) -> None:
        self.consumer = consumer
        self.handoff = handoff
        self.requests: list[StoredRequest] = []
        self.levels: dict[str, StockLevel] = ShortageWatchingLevels(self)
        self.inbox: dict[tuple[str, UUID], str] = {}
        self.reservations: dict[UUID, Reservation] = {}
        self.redeliveries: dict[tuple[str, UUID], int] = {}
        self.result_events: list[RecordedEvent] = []
        self.lock = asyncio.Lock()
        """Serialises the calls as row locks do; the requests' store shares it."""
        self.warehouse = WarehouseEventsInMemory(self)
        self.rules: dict[type[Any], Callable[[Any], Awaitable[Any]]] = {
            PlaceOrder: self._reserve,
            CancelOrder: self._cancel,
            ShipOrder: self._ship,
            RecordShipment: self.warehouse.record_shipment,
            RecordWarehouseCancellation: self.warehouse.record_cancellation,
            RecordAdjustment: self.warehouse.record_adjustment,
        }
        """The rule of each kind of command, as the SQL function of its route."""

    async def apply(self, command: Command[OutcomeT]) -> OutcomeT:
        """Apply ``command`` by the rule of its type (:attr:`rules`), as the SQL functions do.

        Raises:
            LookupError: no rule for the command's type.
        """
        rule = self.rules.get(type(command))
        if rule is None:
            msg = f"no rule applies a {type(command).__name__}"
            raise LookupError(msg)
        outcome: OutcomeT = await rule(command)
        return outcome

    async def count_redelivery(self, event_id: UUID) -> int:
        key = (self.consumer, event_id)
        self.redeliveries[key] = self.redeliveries.get(key, 0) + 1
        return self.redeliveries[key]

    async def _reserve(self, command: PlaceOrder) -> ReservationOutcome:
        demand = aggregate_demand(command.lines)
        if not demand:
            msg = f"order {command.order_id} has no lines"
            raise ValueError(msg)
        async with self.lock:
            key = (self.consumer, command.event_id)
            if key in self.inbox:
                return self._duplicate(command, DuplicateOf.EVENT)
            existing = self.reservations.get(command.order_id)
            placement = apply_placed(
                None if existing is None else existing.state,
                demand,
                {sku: self.levels[sku] for sku in demand if sku in self.levels},
            )
            if placement.decision is None:
                self.inbox[key] = "duplicate_order"
                return self._duplicate(command, DuplicateOf.ORDER)
            reason = placement.decision.reason
            if reason is None:
                for sku, units in placement.state.lines.items():
                    level = self.levels[sku]
                    self.levels[sku] = StockLevel(level.on_hand, level.reserved + units)
            skus = tuple(sorted(placement.decision.skus))
            self.reservations[command.order_id] = Reservation(
                command.event_id,
                reason,
                skus,
                dict(placement.state.lines),
                placement.state.status,
                placement.state.tombstone,
            )
            self.inbox[key] = "reserved" if reason is None else "rejected"
            if reason is None:
                self.record_result("stock.reserved", command, lines=as_lines(placement.state.lines))
                if self.handoff:
                    self.add_request(
                        RequestKind.FULFILMENT_ORDER,
                        command.order_id,
                        command.event_id,
                        dict(placement.state.lines),
                        current_traceparent(),
                    )
            else:
                # A rejection as cancelled names every SKU the order asked for.
                named = sorted(demand) if reason is RejectionReason.CANCELLED else skus
                self.record_result("stock.rejected", command, reason=str(reason), skus=list(named))
            return ReservationOutcome(
                kind=OutcomeKind.RESERVED if reason is None else OutcomeKind.REJECTED,
                order_id=command.order_id,
                event_id=command.event_id,
                reason=reason,
                skus=skus,
            )

    async def _cancel(self, command: CancelOrder) -> CancelOutcome:
        if command.lines is not None and not command.lines:
            msg = f"the cancel of order {command.order_id} names no lines"
            raise ValueError(msg)
        async with self.lock:
            key = (self.consumer, command.event_id)
            if key in self.inbox:
                return CancelOutcome(CancelKind.DUPLICATE, command.order_id, command.event_id)
            existing = self.reservations.get(command.order_id)
            state = None if existing is None else existing.state
            fulfilment_order = self.fulfilment_order(command.order_id)
            decided = (
                cancel_with_handoff(
                    state,
                    command.cancelled(),
                    None if fulfilment_order is None else fulfilment_order.status,
                )
                if self.handoff
                else HandoffCancellation(apply_cancelled(state, command.cancelled()))
            )
            cancellation = decided.cancellation
            if fulfilment_order is not None:
                if decided.withdrawn:
                    fulfilment_order.status = RequestStatus.WITHDRAWN
                elif decided.fulfilment_lines is not None:
                    fulfilment_order.lines = dict(decided.fulfilment_lines)
            if decided.ask:
                self.add_request(
                    RequestKind.CANCELLATION,
                    command.order_id,
                    command.event_id,
                    None if decided.asked is None else dict(decided.asked),
                    current_traceparent(),
                )
            for sku, units in cancellation.lines.items():
                self.levels[sku] = released(self.levels[sku], units)
            self.reservations[command.order_id] = (
                Reservation(
                    None,
                    None,
                    (),
                    status=cancellation.state.status,
                    tombstone=cancellation.state.tombstone,
                )
                if existing is None
                else existing.after(cancellation.state)
            )
            self.inbox[key] = CANCEL_INBOX_OUTCOMES[cancellation.kind]
            if cancellation.lines:
                self.record_result(
                    "stock.released",
                    command,
                    lines=as_lines(cancellation.lines),
                    order_status=str(cancellation.state.status),
                    **SHOP_RELEASE,
                )
            return CancelOutcome(
                cancellation.kind,
                command.order_id,
                command.event_id,
                as_lines(cancellation.lines),
                cancellation.state.status,
            )

    async def _ship(self, command: ShipOrder) -> ShipOutcome:
        async with self.lock:
            key = (self.consumer, command.event_id)
            if key in self.inbox:
                return ShipOutcome(ShipKind.DUPLICATE, command.order_id, command.event_id)
            existing = self.reservations.get(command.order_id)
            shipment = apply_shipped(None if existing is None else existing.state)
            status = None if shipment.state is None else shipment.state.status
            if shipment.kind is ShipKind.NOT_RESERVED:
                return ShipOutcome(shipment.kind, command.order_id, command.event_id, (), status)
            for sku, units in shipment.lines.items():
                self.levels[sku] = shipped(self.levels[sku], units)
            if existing is not None and shipment.state is not None:
                self.reservations[command.order_id] = existing.after(shipment.state)
            if shipment.kind is ShipKind.SHIPPED:
                self.warehouse.nothing_left_to_cancel(command.order_id)
            self.inbox[key] = SHIP_INBOX_OUTCOMES[shipment.kind]
            if shipment.lines:
                self.record_result(
                    "stock.shipped",
                    command,
                    lines=as_lines(shipment.lines),
                    **UPSTREAM_SHIPMENT,
                    order_status=str(status),
                )
            return ShipOutcome(
                shipment.kind,
                command.order_id,
                command.event_id,
                as_lines(shipment.lines),
                status,
            )

    async def put_stock(self, on_hand: Mapping[str, int]) -> None:
        if any(units < 0 for units in on_hand.values()):
            msg = "on_hand must be >= 0"
            raise ValueError(msg)
        async with self.lock:
            below = [
                sku
                for sku, units in on_hand.items()
                if sku in self.levels and units < self.levels[sku].reserved
            ]
            if below:
                raise StockBelowReservedError(below)
            for sku, units in on_hand.items():
                reserved = self.levels[sku].reserved if sku in self.levels else 0
                self.levels[sku] = StockLevel(units, reserved)

    async def levels_of(self, skus: Iterable[str]) -> dict[str, StockLevel]:
        return {sku: self.levels[sku] for sku in skus if sku in self.levels}

    def add_request(
        self,
        kind: RequestKind,
        order_id: UUID,
        causation_id: UUID,
        lines: dict[str, int] | None,
        traceparent: str | None,
    ) -> StoredRequest:
        """Record a pending request with a new idempotency key, as the SQL functions do."""
        request = StoredRequest(
            id=len(self.requests) + 1,
            idempotency_key=uuid4(),
            kind=kind,
            order_id=order_id,
            causation_id=causation_id,
            lines=lines,
            traceparent=traceparent,
            created_at=datetime.now(UTC),
        )
        self.requests.append(request)
        return request

    def fulfilment_order(self, order_id: UUID) -> StoredRequest | None:
        """The fulfilment-order request of ``order_id``, or None when it has none."""
        return next(
            (
                request
                for request in self.requests
                if request.order_id == order_id and request.kind is RequestKind.FULFILMENT_ORDER
            ),
            None,
        )

    def record_sku_result(self, routing_key: str, **fields: Any) -> None:
        """Write a result event about a SKU (``stock.adjusted``, ``stock.shortage``): its
        ``fields`` after ``version``, with no trace context for ``stock.shortage`` (the
        trigger that writes it knows none), the current one otherwise."""
        traceparent = None if routing_key == "stock.shortage" else current_traceparent()
        self.result_events.append(RecordedEvent(routing_key, {"version": 1, **fields}, traceparent))

    def record_result(self, routing_key: str, command: ResultCause, **fields: Any) -> None:
        """Write the result event ``command`` caused (:func:`result_body`), in the current
        trace context, as the SQL functions write it to the outbox."""
        self.result_events.append(
            RecordedEvent(routing_key, result_body(command, **fields), current_traceparent())
        )

    @staticmethod
    def _duplicate(command: PlaceOrder, of: DuplicateOf) -> ReservationOutcome:
        return ReservationOutcome(
            kind=OutcomeKind.DUPLICATE,
            order_id=command.order_id,
            event_id=command.event_id,
            duplicate_of=of,
        )


class FakeWarehouseRequests(WarehouseRequests):
    """The ``WarehouseRequests`` in memory, over the requests of an ``FakeStock``.

    It shares the stock store's rows and lock, as the PostgreSQL store shares the database:
    an accepted cancellation releases stock in ``warehouse`` (``fulfilment.domain.handoff``)
    and writes its result event there. ``audit`` lists ``(key, status before, operator)`` per
    re-send. Times are the wall clock.
    """

    def __init__(self, stock: FakeStock) -> None:
        self.stock = stock
        self.audit: list[tuple[UUID, RequestStatus, str]] = []

    def _claimable(self, request: StoredRequest, now: datetime) -> bool:
        if request.status not in OPEN_STATUSES or request.next_attempt_at > now:
            return False
        same_order = [r for r in self.stock.requests if r.order_id == request.order_id]
        if any(r.id < request.id and r.status in OPEN_STATUSES for r in same_order):
            return False
        if request.kind is RequestKind.FULFILMENT_ORDER:
            return True
        fulfilment_order = self.stock.fulfilment_order(request.order_id)
        return fulfilment_order is not None and fulfilment_order.status is RequestStatus.ACCEPTED

    async def claim(self, limit: int, *, lease_seconds: float) -> list[WarehouseRequest]:
        if limit < 1 or lease_seconds <= 0:
            msg = f"limit {limit} must be >= 1 and lease_seconds {lease_seconds} > 0"
            raise ValueError(msg)
        async with self.stock.lock:
            now = datetime.now(UTC)
            due = sorted(
                (r for r in self.stock.requests if self._claimable(r, now)),
                key=lambda r: (r.next_attempt_at, r.id),
            )[:limit]
            claimed = []
            for request in due:
                if request.body is None:
                    lines: Mapping[str, int] | None = request.lines
                    if request.kind is RequestKind.CANCELLATION:
                        reservation = self.stock.reservations.get(request.order_id)
                        to_send = cancellation_to_send(
                            None if reservation is None else reservation.state, lines
                        )
                        if not to_send.send:
                            request.status = RequestStatus.WITHDRAWN
                            request.answered_at = now
                            continue
                        lines = to_send.lines
                    request.body = request_body(
                        request.kind, request.order_id, lines, request.created_at
                    )
                request.attempts += 1
                request.first_attempt_at = request.first_attempt_at or now
                request.last_attempt_at = now
                request.status = RequestStatus.SENDING
                request.next_attempt_at = now + timedelta(seconds=lease_seconds)
                if request.warehouse_id is None:
                    fulfilment_order = self.stock.fulfilment_order(request.order_id)
                    request.warehouse_id = (
                        None if fulfilment_order is None else fulfilment_order.warehouse_id
                    )
                claimed.append(
                    WarehouseRequest(
                        id=request.id,
                        idempotency_key=request.idempotency_key,
                        kind=request.kind,
                        order_id=request.order_id,
                        causation_id=request.causation_id,
                        body=request.body,
                        attempts=request.attempts,
                        first_attempt_at=request.first_attempt_at,
                        warehouse_id=request.warehouse_id,
                        traceparent=request.traceparent,
                    )
                )
            return sorted(claimed, key=lambda claimed_one: claimed_one.id)

    async def record(
        self,
        request: WarehouseRequest,
        answer: Answer,
        *,
        retry_in_seconds: float | None = None,
    ) -> None:
        async with self.stock.lock:
            stored = self.stock.requests[request.id - 1]
            if stored.status is not RequestStatus.SENDING:
                return
            now = datetime.now(UTC)
            stored.last_status_code = answer.status_code
            stored.last_answer = answer.answer
            if isinstance(answer, Retry | RateLimited | CredentialsRefused):
                stored.next_attempt_at = now + timedelta(seconds=retry_in_seconds or 0.0)
                return
            stored.answered_at = now
            if isinstance(answer, Accepted):
                stored.status = RequestStatus.ACCEPTED
                stored.warehouse_id = answer.warehouse_id or stored.warehouse_id
                if stored.kind is RequestKind.CANCELLATION:
                    self._apply(stored, cancellation_accepted(self._state(stored), stored.lines))
                return
            if isinstance(answer, Refused) and stored.kind is RequestKind.CANCELLATION:
                stored.status = RequestStatus.REFUSED
                self._apply(stored, cancellation_refused(self._state(stored)))
                self.stock.result_events.append(
                    RecordedEvent(
                        "stock.cancel_refused",
                        {
                            "version": 1,
                            "causation_id": str(stored.causation_id),
                            "order_id": str(stored.order_id),
                            "lines": None
                            if stored.lines is None
                            else [
                                {"sku": sku, "quantity": units}
                                for sku, units in sorted(stored.lines.items())
                            ],
                            "warehouse_id": stored.warehouse_id,
                        },
                        stored.traceparent,
                    )
                )
                return
            stored.status = RequestStatus.FAILED
            if stored.kind is RequestKind.FULFILMENT_ORDER:
                waiting = [
                    r
                    for r in self.stock.requests
                    if r.order_id == stored.order_id
                    and r.kind is RequestKind.CANCELLATION
                    and r.status in OPEN_STATUSES
                ]
                _, results = fulfilment_order_failed(
                    self._state(stored), [r.lines for r in waiting]
                )
                for cancel, cancellation in zip(waiting, results, strict=True):
                    self._apply(cancel, cancellation)
                    cancel.status = RequestStatus.WITHDRAWN

    def _state(self, request: StoredRequest) -> OrderState:
        return self.stock.reservations[request.order_id].state

    def _apply(self, cancel: StoredRequest, cancellation: Cancellation) -> None:
        """Release what ``cancellation`` gives back, as ``cancel``'s cancel, with its event."""
        if cancellation.kind is CancelKind.RELEASED:
            cancel.released_order = True
        if not cancellation.lines:
            return
        for sku, units in cancellation.lines.items():
            self.stock.levels[sku] = released(self.stock.levels[sku], units)
        existing = self.stock.reservations[cancel.order_id]
        self.stock.reservations[cancel.order_id] = existing.after(cancellation.state)
        self.stock.result_events.append(
            RecordedEvent(
                "stock.released",
                {
                    "version": 1,
                    "causation_id": str(cancel.causation_id),
                    "order_id": str(cancel.order_id),
                    "lines": [
                        {"sku": line.sku, "quantity": line.quantity}
                        for line in as_lines(cancellation.lines)
                    ],
                    "order_status": str(cancellation.state.status),
                    **SHOP_RELEASE,
                },
                cancel.traceparent,
            )
        )

    async def expire(self, retention_seconds: float) -> int:
        async with self.stock.lock:
            horizon = datetime.now(UTC) - timedelta(seconds=retention_seconds)
            expired = [
                r
                for r in self.stock.requests
                if r.status in OPEN_STATUSES
                and r.first_attempt_at is not None
                and r.first_attempt_at < horizon
            ]
            for request in expired:
                request.status = RequestStatus.EXPIRED
            return len(expired)

    async def backlog(self) -> RequestBacklog:
        now = datetime.now(UTC)
        counts: dict[tuple[RequestKind, RequestStatus], int] = {}
        for request in self.stock.requests:
            key = (request.kind, request.status)
            counts[key] = counts.get(key, 0) + 1
        ages = [
            (now - r.created_at).total_seconds()
            for r in self.stock.requests
            if r.status in OPEN_STATUSES
        ]
        return RequestBacklog(len(ages), max(ages, default=None), counts)

    async def find(self, statuses: Collection[RequestStatus], limit: int) -> list[RequestRecord]:
        return [_record_of(r) for r in self.stock.requests if r.status in set(statuses)][:limit]

    async def get(self, idempotency_key: UUID) -> RequestRecord | None:
        found = self._by_key(idempotency_key)
        return None if found is None else _record_of(found)

    async def resend(self, idempotency_key: UUID, *, operator: str) -> bool:
        async with self.stock.lock:
            request = self._by_key(idempotency_key)
            if request is None or request.status not in {
                RequestStatus.FAILED,
                RequestStatus.EXPIRED,
            }:
                return False
            if request.kind is RequestKind.FULFILMENT_ORDER and (
                self._state(request).status is not OrderStatus.RESERVED
                or any(
                    r.order_id == request.order_id
                    and r.kind is RequestKind.CANCELLATION
                    and r.status is RequestStatus.WITHDRAWN
                    for r in self.stock.requests
                )
            ):
                return False
            self.audit.append((idempotency_key, request.status, operator))
            request.status = RequestStatus.SENDING
            request.next_attempt_at = datetime.now(UTC)
            request.answered_at = None
            return True

    def _by_key(self, idempotency_key: UUID) -> StoredRequest | None:
        return next((r for r in self.stock.requests if r.idempotency_key == idempotency_key), None)


def _record_of(request: StoredRequest) -> RequestRecord:
    return RequestRecord(
        id=request.id,
        idempotency_key=request.idempotency_key,
        kind=request.kind,
        order_id=request.order_id,
        causation_id=request.causation_id,
        status=request.status,
        lines=None
        if request.lines is None
        else tuple(OrderLine(sku, units) for sku, units in sorted(request.lines.items())),
        body=request.body,
        attempts=request.attempts,
        created_at=request.created_at,
        next_attempt_at=request.next_attempt_at,
        first_attempt_at=request.first_attempt_at,
        last_attempt_at=request.last_attempt_at,
        answered_at=request.answered_at,
        warehouse_id=request.warehouse_id,
        last_status_code=request.last_status_code,
        last_answer=request.last_answer,
        traceparent=request.traceparent,
    )
