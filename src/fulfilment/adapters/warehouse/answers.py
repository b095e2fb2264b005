"""The warehouse system's answers, classified: one pure function for every row of the API's table.

docs/design.md, "The API it calls" gives the table; :func:`classify` is it, written once, so that
the dispatcher acts on a class of answer (``domain.handoff.Answer``) and never on a status
code. A 2xx whose body is not what the API says is ``Failed`` (kept for an operator), not
``Accepted``: the service cannot record a warehouse id it did not get. :func:`classify_poll`
does the same for the poll's ``GET {base}/fulfilment-orders/{id}`` (``domain.polls.PollAnswer``),
and turns what a 200 lists into the commands a webhook would bring.
"""

from __future__ import annotations

import email.utils
import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from http import HTTPStatus

from pydantic import ValidationError

from fulfilment.contracts.warehouse_events import FulfilmentOrderV1
from fulfilment.domain.handoff import (
    Accepted,
    Answer,
    CredentialsRefused,
    Failed,
    RateLimited,
    Refused,
    RequestKind,
    Retry,
)
from fulfilment.domain.polls import (
    FulfilmentOrderToPoll,
    NotFound,
    PollAnswer,
    Polled,
    WarehouseChange,
)
from fulfilment.domain.warehouse_events import RecordShipment, Source

DEFAULT_RATE_LIMIT_SECONDS = 1.0
"""The wait after a 429 without a readable ``Retry-After``: the API promises one, and a second
is what the shortest window of a per-second limit needs."""

ANSWER_CHARS = 1000
"""Most characters of an answer's body kept for operators (``last_answer``)."""

CANCELLED_STATUSES = frozenset({"cancelled", "partially_cancelled"})
"""The ``status`` of an accepted cancellation."""


def retry_after_seconds(value: str | None, *, now: datetime | None = None) -> float | None:
    """The seconds that a ``Retry-After`` header's ``value`` asks to wait, or None.

    RFC 9110, section 10.2.3: either a number of seconds (a decimal fraction is accepted too)
    or an HTTP date (parsed with ``email.utils.parsedate_to_datetime``), counted from ``now``
    (the current time when None); a date in the past is 0. None: no header, or one that is
    neither.
    """
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000": UTC by RFC 5322
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def classify(  # noqa: PLR0911, PLR0913 - one return per row of the API's table; the design's signature
    kind: RequestKind,
    status_code: int | None,
    body: bytes | None,
    headers: Mapping[str, str],
    error: Exception | None = None,
    *,
    now: datetime | None = None,
) -> Answer:
    """The class of the warehouse's answer to a request of ``kind``.

    ``status_code``, ``body`` and ``headers`` (names in lower case, as httpx's headers match
    them) are the answer's; ``error`` is the transport's failure when no answer came (then
    ``status_code`` is None): a timeout or a connection error is ``Retry``, since the warehouse
    may have committed. ``now`` is the time an HTTP-date ``Retry-After`` is counted from.

    - 201, or 200 (a replay): ``Accepted`` with the warehouse's ``id`` (fulfilment order), or
      with ``status`` cancelled/partially_cancelled (cancellation); any other body ``Failed``;
    - 409 ``in_flight``: ``Retry``; 409 ``duplicate_reference`` with an ``id``: ``Accepted``
      (fulfilment order); 409 ``too_late``: ``Refused`` (cancellation); another 409 ``Failed``;
    - 401, 403: ``CredentialsRefused``; 429: ``RateLimited`` for ``Retry-After`` (seconds or
      HTTP date; :data:`DEFAULT_RATE_LIMIT_SECONDS` without one);
    - 5xx: ``Retry`` (with its ``Retry-After``, if any); every other status ``Failed``.
    """
    if status_code is None:
        described = f"{type(error).__name__}: {error}" if error else "no answer"
        return Retry(answer=described[:ANSWER_CHARS])
    text = (body or b"").decode("utf-8", errors="replace")[:ANSWER_CHARS]
    document = _document(body)
    error_name = document.get("error") if document else None
    if status_code in {HTTPStatus.OK, HTTPStatus.CREATED}:
        return _success(kind, status_code, text, document)
    if status_code in {HTTPStatus.UNAUTHORIZED, HTTPStatus.FORBIDDEN}:
        return CredentialsRefused(status_code=status_code, answer=text)
    if status_code == HTTPStatus.TOO_MANY_REQUESTS:
        after = retry_after_seconds(headers.get("retry-after"), now=now)
        return RateLimited(
            after_seconds=DEFAULT_RATE_LIMIT_SECONDS if after is None else after, answer=text
        )
    if status_code >= HTTPStatus.INTERNAL_SERVER_ERROR:
        after = retry_after_seconds(headers.get("retry-after"), now=now)
        return Retry(answer=text, status_code=status_code, after_seconds=after)
    if status_code == HTTPStatus.CONFLICT:
        return _conflict(kind, text, document, headers, now)
    reason = error_name if isinstance(error_name, str) and error_name else f"http_{status_code}"
    return Failed(reason=reason, answer=text, status_code=status_code)


_AS_A_REQUEST = frozenset(
    {HTTPStatus.UNAUTHORIZED, HTTPStatus.FORBIDDEN, HTTPStatus.TOO_MANY_REQUESTS}
)
"""The statuses a poll's answer means as a request's: credentials refused, rate limited."""


def classify_poll(  # noqa: PLR0913 - classify()'s arguments and the order asked about
    order: FulfilmentOrderToPoll,
    status_code: int | None,
    body: bytes | None,
    headers: Mapping[str, str],
    error: Exception | None = None,
    *,
    now: datetime | None = None,
) -> PollAnswer:
    """The class of the warehouse's answer to ``GET {base}/fulfilment-orders/{id}`` about ``order``.

    The other arguments are as :func:`classify`'s.

    - 200 with a :class:`~fulfilment.contracts.warehouse_events.FulfilmentOrderV1` of that id
      and reference: ``Polled``, its shipments and cancellations as commands (``source``
      ``poll``, no webhook id) in the order they happened; any other 200 ``Failed``
      (``unexpected_answer``, the body kept);
    - 404: ``NotFound``; 401, 403: ``CredentialsRefused``; 429: ``RateLimited``; 5xx, a
      timeout, a connection error: ``Retry``, as for a request; every other status ``Failed``.
    """
    text = (body or b"").decode("utf-8", errors="replace")[:ANSWER_CHARS]
    if status_code == HTTPStatus.OK:
        return _polled(order, body or b"")
    if status_code == HTTPStatus.NOT_FOUND:
        return NotFound(answer=text)
    if status_code is None or status_code in _AS_A_REQUEST or status_code >= 500:  # noqa: PLR2004 - a 5xx
        answer = classify(RequestKind.FULFILMENT_ORDER, status_code, body, headers, error, now=now)
        if isinstance(answer, Retry | RateLimited | CredentialsRefused):
            return answer
    # A 201 or a 409 (in flight, say) is no answer a GET gets: the API's contract is broken.
    return Failed(reason=f"http_{status_code}", answer=text, status_code=status_code)


def _polled(order: FulfilmentOrderToPoll, body: bytes) -> Polled | Failed:
    """A 200's body: the fulfilment order asked about, or ``Failed`` (``unexpected_answer``)."""
    text = body.decode("utf-8", errors="replace")[:ANSWER_CHARS]
    try:
        polled = FulfilmentOrderV1.model_validate_json(body)
    except ValidationError as error:
        reason = f"{text} ({error.error_count()} errors: {error.errors()[0]['msg']})"
        return Failed(
            reason="unexpected_answer",
            answer=reason[:ANSWER_CHARS],
            status_code=HTTPStatus.OK.value,
        )
    if polled.id != order.warehouse_id or polled.reference != order.order_id:
        return Failed(reason="unexpected_answer", answer=text, status_code=HTTPStatus.OK.value)
    changes: list[WarehouseChange] = [
        shipment.to_command(webhook_id=None, source=Source.POLL) for shipment in polled.shipments
    ]
    changes.extend(
        cancellation.to_command(webhook_id=None, source=Source.POLL)
        for cancellation in polled.cancellations
    )
    changes.sort(key=_happened)
    return Polled(status_code=HTTPStatus.OK.value, status=polled.status, changes=tuple(changes))


def _happened(change: WarehouseChange) -> tuple[datetime, int]:
    """When ``change`` happened, a shipment before a cancellation of the same instant."""
    if isinstance(change, RecordShipment):
        return change.shipped_at, 0
    return change.cancelled_at, 1


def _success(
    kind: RequestKind, status_code: int, text: str, document: dict[str, object] | None
) -> Answer:
    """200/201: accepted when the body is the API's, else failed (``unexpected_answer``)."""
    if document is not None and kind is RequestKind.FULFILMENT_ORDER:
        warehouse_id = document.get("id")
        if isinstance(warehouse_id, str) and warehouse_id:
            return Accepted(status_code=status_code, answer=text, warehouse_id=warehouse_id)
    cancelled = document is not None and document.get("status") in CANCELLED_STATUSES
    if cancelled and kind is RequestKind.CANCELLATION:
        return Accepted(status_code=status_code, answer=text)
    return Failed(reason="unexpected_answer", answer=text, status_code=status_code)


def _conflict(
    kind: RequestKind,
    text: str,
    document: dict[str, object] | None,
    headers: Mapping[str, str],
    now: datetime | None,
) -> Answer:
    """409: in flight, a duplicate reference, too late, or (any other) failed."""
    conflict = HTTPStatus.CONFLICT
    error_name = document.get("error") if document else None
    if error_name == "in_flight":
        after = retry_after_seconds(headers.get("retry-after"), now=now)
        return Retry(answer=text, status_code=conflict, after_seconds=after)
    if error_name == "duplicate_reference" and kind is RequestKind.FULFILMENT_ORDER:
        warehouse_id = document.get("id") if document else None
        if isinstance(warehouse_id, str) and warehouse_id:
            return Accepted(status_code=conflict, answer=text, warehouse_id=warehouse_id)
    if error_name == "too_late" and kind is RequestKind.CANCELLATION:
        return Refused(status_code=conflict, answer=text)
    reason = error_name if isinstance(error_name, str) and error_name else "http_409"
    return Failed(reason=reason, answer=text, status_code=conflict)


def _document(body: bytes | None) -> dict[str, object] | None:
    """``body`` as a JSON object, or None (empty, not JSON, or not an object)."""
    if not body:
        return None
    try:
        document = json.loads(body)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None
