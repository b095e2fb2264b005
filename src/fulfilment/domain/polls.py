"""The poll of fulfilment orders: which the dispatcher asks about, and the answers it gets.

Webhooks arrive at least once, out of order, and sometimes not at all, so the dispatcher also
asks the warehouse (``GET {base}/fulfilment-orders/{id}``) about each accepted fulfilment order
whose order still holds units and has had no news (no shipment, no cancellation recorded) for
``FULFILMENT_WAREHOUSE_RECONCILE_AFTER_SECONDS``, then again at that interval while it holds
units (product contract, "Hearing back from the warehouse", "Pulled as a fallback"). What the
answer lists becomes the same commands as a webhook's (:class:`Polled`), applied through
``Stock.apply``, where a shipment or cancellation applied before (by webhook or by an earlier
poll) is a ``duplicate`` that changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from fulfilment.domain.handoff import CredentialsRefused, Failed, RateLimited, Retry
from fulfilment.domain.warehouse_events import RecordShipment, RecordWarehouseCancellation


@dataclass(frozen=True, slots=True)
class FulfilmentOrderToPoll:
    """An accepted fulfilment order due to be asked about.

    Attributes:
        request_id: the fulfilment order's row in ``warehouse_requests``.
        order_id: the order (the fulfilment order's ``reference``).
        warehouse_id: the warehouse's id of it, the ``{id}`` of the ``GET``.
    """

    request_id: int
    order_id: UUID
    warehouse_id: str


WarehouseChange = RecordShipment | RecordWarehouseCancellation
"""A change the warehouse made to an order, as a command of ``Stock.apply``."""


@dataclass(frozen=True, slots=True)
class Polled:
    """200: the fulfilment order as the warehouse knows it.

    Attributes:
        status_code: 200.
        status: the warehouse's status of it (``received``, ``partially_shipped`` ...).
        changes: its shipments and the warehouse's own cancellations, as commands with
            ``source`` ``poll`` and no ``webhook_id``, in the order they happened (by
            ``shipped_at`` / ``cancelled_at``; a shipment before a cancellation of the same
            instant, which is what a cancellation of "everything still held" meant).
    """

    status_code: int
    status: str
    changes: tuple[WarehouseChange, ...]


@dataclass(frozen=True, slots=True)
class NotFound:
    """404: the warehouse holds no fulfilment order of that id; asked again at the next interval."""

    answer: str
    status_code: int = 404


PollAnswer = Polled | NotFound | Retry | RateLimited | CredentialsRefused | Failed
"""Every class of answer to a poll: a 5xx, a timeout or a connection error is ``Retry``, a
429 ``RateLimited``, a 401/403 ``CredentialsRefused``, another status or a 200 whose body is
not a fulfilment order of the id asked ``Failed``."""
