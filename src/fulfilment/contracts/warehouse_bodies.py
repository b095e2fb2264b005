"""The bodies of the requests to the warehouse system's API (docs/design.md, "The API it calls").

``POST {base}/fulfilment-orders`` sends ``{"reference", "lines", "requested_at"}`` and
``POST {base}/fulfilment-orders/{id}/cancellations`` sends ``{"lines"}``, or ``{}`` for the
whole order. A request's body is built once, by :func:`request_body`, at its first attempt,
stored (``warehouse_requests.body``) and sent byte for byte on every retry: the warehouse
compares the body of a repeated key with the first (the IETF draft "The Idempotency-Key HTTP
Header Field" answers 422 to a key reused with another body), so the bytes must never change.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from uuid import UUID

from fulfilment.domain.handoff import RequestKind


def request_body(
    kind: RequestKind,
    order_id: UUID,
    lines: Mapping[str, int] | None,
    requested_at: datetime,
) -> bytes:
    """The exact bytes to send for a request: compact UTF-8 JSON, keys in the API's order.

    Args:
        kind: a fulfilment order or a cancellation.
        order_id: the order, sent as a fulfilment order's ``reference``.
        lines: units per SKU, sent sorted by SKU (code point order); None for a cancellation
            of the whole order, whose body is ``{}``.
        requested_at: timezone-aware; when the request was recorded (its ``created_at``),
            sent as a fulfilment order's ``requested_at`` in RFC 3339, in UTC.

    Raises:
        ValueError: a fulfilment order without lines, or ``requested_at`` without an offset.
    """
    sent = [{"sku": sku, "quantity": units} for sku, units in sorted((lines or {}).items())]
    if kind is RequestKind.CANCELLATION:
        document: dict[str, object] = {} if lines is None else {"lines": sent}
    else:
        if not sent:
            msg = f"the fulfilment order of {order_id} has no lines"
            raise ValueError(msg)
        if requested_at.utcoffset() is None:
            msg = "requested_at must carry an offset"
            raise ValueError(msg)
        document = {
            "reference": str(order_id),
            "lines": sent,
            "requested_at": requested_at.astimezone(UTC).isoformat(timespec="microseconds"),
        }
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
