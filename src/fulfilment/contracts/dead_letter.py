"""The dead-letter header contract: what a message in the DLQ says about why it is there.

The worker writes these headers when it gives up on a delivery
(``fulfilment.worker.dead_lettering``); ``fulfilment dlq`` and ``fulfilment report`` read
them back with :func:`describe_dead_letter`. A message the broker dead-lettered by itself has
none of them, only RabbitMQ's ``x-death``; it is described from that, and one that exhausted the
delivery limit (it kept crashing workers) is classed ``poison``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

DEAD_LETTER_TTL_SECONDS = 14 * 24 * 3600.0
"""How long a dead letter stays in its DLQ before the broker drops it (14 days): the
``message-ttl`` of the shipped DLQ policies, in milliseconds there, and the default of
``FULFILMENT_DEAD_LETTER_TTL_SECONDS``."""

HEADER_PREFIX = "x-fulfilment-"
"""Every header the service adds starts with this; a replay strips them all."""

FAILURE_CLASS = f"{HEADER_PREFIX}failure-class"
REASON = f"{HEADER_PREFIX}reason"
EXCEPTION_TYPE = f"{HEADER_PREFIX}exception-type"
EXCEPTION_MESSAGE = f"{HEADER_PREFIX}exception-message"
STACK = f"{HEADER_PREFIX}stack"
DELIVERY_COUNT = f"{HEADER_PREFIX}delivery-count"
ATTEMPTS = f"{HEADER_PREFIX}attempts"
FIRST_FAILURE_AT = f"{HEADER_PREFIX}first-failure-at"
LAST_FAILURE_AT = f"{HEADER_PREFIX}last-failure-at"
DEAD_LETTERED_AT = f"{HEADER_PREFIX}dead-lettered-at"
SERVICE_VERSION = f"{HEADER_PREFIX}service-version"
HOST = f"{HEADER_PREFIX}host"
ORIGINAL_QUEUE = f"{HEADER_PREFIX}original-queue"
ORIGINAL_EXCHANGE = f"{HEADER_PREFIX}original-exchange"
ORIGINAL_ROUTING_KEY = f"{HEADER_PREFIX}original-routing-key"
REPLAYED_AT = f"{HEADER_PREFIX}replayed-at"
REPLAY_ID = f"{HEADER_PREFIX}replay-id"
REPLAY_COUNT = f"{HEADER_PREFIX}replay-count"
"""How often the message was replayed from a DLQ: carried across replays and dead letters, so
``fulfilment dlq replay`` can refuse one replayed ``FULFILMENT_REPLAY_LIMIT`` times."""

REPLAY_HEADERS = frozenset({REPLAY_ID, REPLAYED_AT, REPLAY_COUNT})
"""The ``x-fulfilment-*`` headers a replayed message carries (``replay_headers``); a dead letter
of it keeps them, so it can be traced to the audit table and its replays counted."""

BROKER_HEADERS = ("x-death", "x-delivery-count")
"""Headers RabbitMQ sets on dead-lettering and redelivery."""
BROKER_HEADER_PREFIXES = ("x-first-death-", "x-last-death-")
"""Header families RabbitMQ sets on dead-lettering (``x-first-death-reason`` ...)."""


class FailureClass(StrEnum):
    """Why a message is in the DLQ; the ``x-fulfilment-failure-class`` header.

    Written by the service:

    - ``permanent``: the payload can never succeed (malformed, unknown version, a value the
      database cannot store); dead-lettered on its first delivery. Replay only after the
      service learned to accept it.
    - ``unexpected``: an error the service does not know (a bug); replay after the fix.
    - ``poison``: it was delivered as often as the delivery limit allows and crashed or hung
      workers every time. Written by the service when it counts the deliveries itself, or
      recognised from the broker's ``x-death`` reason ``delivery_limit``. (A database outage
      is not dead-lettered: the delivery is requeued and the consumer paused, see
      ``worker.consumer_control``.)

    Recognised from the broker's ``x-death`` (no ``x-fulfilment-*`` headers):

    - ``broker_rejected``: the worker rejected it without explaining itself, which happens
      only when publishing its own dead letter failed otherwise than by a refusal of the
      broker, which holds the delivery instead (``x-death`` reason ``rejected``).
    - ``broker_other``: any other ``x-death`` reason (``expired``, ``maxlen``), or no reason.
    """

    PERMANENT = "permanent"
    UNEXPECTED = "unexpected"
    POISON = "poison"
    BROKER_REJECTED = "broker_rejected"
    BROKER_OTHER = "broker_other"


SERVICE_FAILURE_CLASSES = (
    FailureClass.PERMANENT,
    FailureClass.UNEXPECTED,
    FailureClass.POISON,
)
"""The classes the worker itself writes (the ``reason`` label of dead-lettered events)."""

_BROKER_CLASSES = {
    "delivery_limit": FailureClass.POISON,
    "rejected": FailureClass.BROKER_REJECTED,
}


@dataclass(frozen=True, slots=True)
class DeadLetterDescription:
    """What the headers and body of one dead letter say, for people and for grouping.

    Attributes:
        failure_class: see :class:`FailureClass`.
        exception_type: the exception's class name, or ``""`` (broker-dead-lettered).
        reason: one line: the service's reason, or the ``x-death`` reason and queue.
        dead_lettered_at: when it entered the DLQ (the service's header, else the first
            ``x-death`` time), or None when neither says.
        event_id: the body's ``event_id`` when the body is a JSON object holding a string
            there, else None.
        delivery_count: deliveries before the last one (the service's header, else the
            ``x-death`` count).
        original_queue: the queue it died in, or ``""``.
        original_exchange: the exchange it was published to (the service's header, else the
            first ``x-death`` exchange), or None when neither says. ``""`` is the default
            exchange.
        original_routing_key: the routing key it was published with (the service's header,
            else the first of the first ``x-death`` routing keys), or None.
    """

    failure_class: FailureClass
    exception_type: str
    reason: str
    dead_lettered_at: datetime | None
    event_id: str | None
    delivery_count: int
    original_queue: str
    original_exchange: str | None = None
    original_routing_key: str | None = None

    @property
    def group(self) -> str:
        """``<failure class>/<exception type>`` (``-`` for none): how ``dlq list`` groups."""
        return f"{self.failure_class}/{self.exception_type or '-'}"


def describe_dead_letter(
    headers: Mapping[str, object] | None, body: bytes
) -> DeadLetterDescription:
    """Describe one dead letter from its headers and body; never raises on odd input.

    A message carrying ``x-death`` was dead-lettered by the broker, whatever ``x-fulfilment-*``
    headers it has: the service strips ``x-death`` from the dead letters it publishes (and a
    replay strips both), so such headers can only be the original sender's, and are not
    believed.
    """
    headers = headers or {}
    event_id = event_id_of(body)
    written = headers.get(FAILURE_CLASS)
    if isinstance(written, str) and "x-death" not in headers:
        try:
            failure_class = FailureClass(written)
        except ValueError:
            failure_class = FailureClass.UNEXPECTED
        return DeadLetterDescription(
            failure_class=failure_class,
            exception_type=_text(headers.get(EXCEPTION_TYPE)),
            reason=_text(headers.get(REASON)),
            dead_lettered_at=parse_time(headers.get(DEAD_LETTERED_AT)),
            event_id=event_id,
            delivery_count=_int(headers.get(DELIVERY_COUNT)),
            original_queue=_text(headers.get(ORIGINAL_QUEUE)),
            original_exchange=_optional_text(headers.get(ORIGINAL_EXCHANGE)),
            original_routing_key=_optional_text(headers.get(ORIGINAL_ROUTING_KEY)),
        )
    death = _first_death(headers)
    death_reason = _text(death.get("reason"))
    queue = _text(death.get("queue"))
    count = _int(death.get("count"))
    reason = f"dead-lettered by the broker: {death_reason or 'no reason given'}"
    if queue:
        reason += f" in {queue}"
    if death_reason == "delivery_limit":
        reason += " (it failed every delivery: a crash, a hang or a lost connection each time)"
    elif death_reason == "expired":
        reason += (
            " (its expiration, set by the sender or a message-ttl policy, passed before a worker"
            " took it: replay it, a replay carries no expiration)"
        )
    return DeadLetterDescription(
        failure_class=_BROKER_CLASSES.get(death_reason, FailureClass.BROKER_OTHER),
        exception_type="",
        reason=reason,
        dead_lettered_at=parse_time(death.get("time")),
        event_id=event_id,
        delivery_count=_int(headers.get("x-delivery-count")) or count,
        original_queue=queue,
        original_exchange=_optional_text(death.get("exchange")),
        original_routing_key=_first_routing_key(death.get("routing-keys")),
    )


def replay_count(headers: Mapping[str, object] | None) -> int:
    """The :data:`REPLAY_COUNT` of ``headers``: 0 when absent or not a whole number >= 0."""
    value = (headers or {}).get(REPLAY_COUNT)
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if isinstance(value, bool) or not isinstance(value, int | str):
        return 0
    try:
        count = int(value)
    except ValueError:
        return 0
    return max(count, 0)


def replay_headers(
    headers: Mapping[str, object] | None,
    *,
    replay_id: str,
    replayed_at: datetime,
    replays_before: int = 0,
) -> dict[str, object]:
    """The headers a replayed message is published with.

    The broker's dead-lettering and redelivery headers and every ``x-fulfilment-*`` header are
    dropped (the replay is a fresh delivery, and its old reasons would mislead a second dead
    letter); the producer's own headers stay; :data:`REPLAY_ID` and :data:`REPLAYED_AT` are
    added so a replayed message, and a dead letter of it, can be traced to the audit table, and
    :data:`REPLAY_COUNT` is set to ``replays_before + 1`` (the replays the caller counted,
    from this header and from the audit table).
    """
    kept: dict[str, object] = {
        key: value
        for key, value in (headers or {}).items()
        if key not in BROKER_HEADERS
        and not key.startswith(BROKER_HEADER_PREFIXES)
        and not key.startswith(HEADER_PREFIX)
    }
    kept[REPLAY_ID] = replay_id
    kept[REPLAYED_AT] = replayed_at.astimezone(UTC).isoformat()
    kept[REPLAY_COUNT] = replays_before + 1
    return kept


def event_id_of(body: bytes) -> str | None:
    """The ``event_id`` string of a JSON object body, or None for anything else."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    value = document.get("event_id") if isinstance(document, dict) else None
    return value if isinstance(value, str) else None


def parse_time(value: object) -> datetime | None:
    """A header time as an aware UTC datetime: ISO 8601 text, or an AMQP timestamp."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return None
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return None


def _first_death(headers: Mapping[str, object]) -> Mapping[str, object]:
    deaths = headers.get("x-death")
    if isinstance(deaths, list) and deaths and isinstance(deaths[0], Mapping):
        return deaths[0]
    return {}


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def _optional_text(value: object) -> str | None:
    return None if value is None else _text(value)


def _first_routing_key(value: object) -> str | None:
    if isinstance(value, list) and value:
        return _text(value[0])
    return None


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
