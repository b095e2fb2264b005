"""``fulfilment report`` and the reconciliation: what happened to the orders; is the stock right.

``fulfilment reconcile`` reads the published files (``fulfilment.dataset.reconcile``), then
checks their events here (:func:`reconcile`). Both read every queue of the topology
(``routes.table.SUBSCRIBED_QUEUES``) and every dead-letter queue: the events of all
three kinds (``OrderPlaced``, ``OrderCancelled``, ``OrderShipped``) share the inbox, and each
kind has its own DLQ.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from typing import Any
from uuid import UUID

from fulfilment.adapters.postgres.admin import processed_event_ids, stock_session
from fulfilment.adapters.postgres.outcomes import outcome_report
from fulfilment.adapters.postgres.warehouse_event_reads import WarehouseCounts, warehouse_counts
from fulfilment.adapters.postgres.warehouse_requests import PostgresWarehouseRequests
from fulfilment.adapters.rabbitmq.connection import connect
from fulfilment.adapters.rabbitmq.inspection import (
    DeadLetterSummary,
    browse_dead_letters,
    queue_state,
)
from fulfilment.domain.handoff import RequestBacklog, RequestStatus
from fulfilment.routes.table import DEAD_LETTER_QUEUES, SUBSCRIBED_QUEUES
from fulfilment.tools.command import CommandError, Echo, ToolOptions
from fulfilment.tools.virtual_host import missing_queues_note


async def report_command(
    options: ToolOptions,
    *,
    as_json: bool,
    echo: Echo,
    handoff: bool = False,
    reconcile_after_seconds: float | None = None,
) -> None:
    """``fulfilment report``: echo the report, for people or (``as_json``) as one JSON document.

    ``handoff``: the hand-off to the warehouse system is configured (``FULFILMENT_WAREHOUSE_URL``
    set); ``reconcile_after_seconds``: ``FULFILMENT_WAREHOUSE_RECONCILE_AFTER_SECONDS``, to
    count what the warehouse sent back; see :func:`collect_report`.

    Raises:
        CommandError: a stock invariant does not hold (exit 1), after the report.
        DatabaseUnavailableError, BrokerUnavailableError: a service does not answer.
    """
    document = await collect_report(
        options, handoff=handoff, reconcile_after_seconds=reconcile_after_seconds
    )
    echo(json.dumps(document, indent=2, sort_keys=True) if as_json else render_report(document))
    if not document["invariants"]["ok"]:
        msg = "stock invariants do not hold (see the report above)"
        raise CommandError(msg)


async def collect_report(
    options: ToolOptions, *, handoff: bool = False, reconcile_after_seconds: float | None = None
) -> dict[str, Any]:
    """The report as a JSON-ready document.

    Shape: ``{"outcomes": {"reserved", "rejected": {reason: count}, "released", "shipped",
    "cancelled", "duplicate_orders", "inbox_total", "processed": {outcome: count}},
    "dead_lettered": {"total", "by_queue": {dlq: count}, "by_reason": [{"queue", "class",
    "reason", "count"}]}, "pending": {"ready", "consumers", "by_queue": {queue: {"ready",
    "consumers"}}}, "outbox": {"unpublished", "published"}, "invariants": {..., "ok"},
    "shortage": {"skus", "units", "examples": [sku]}, "missing_queues": [queue]}``:
    orders per state and events per outcome (``fulfilment.adapters.postgres.outcomes``), the
    outbox's result events waiting for the relay and published, the short SKUs (more reserved
    than on hand after a reported loss: the shortage rule, not a violation of the
    invariants); ``pending.ready`` is the
    ready messages of all subscribed queues and ``pending.consumers`` the fewest consumers
    any of them has. A DLQ deeper than 65,535 is read up to there; the rest is one
    ``by_reason`` row of class ``unread``. ``missing_queues`` names the subscribed queues and
    DLQs the virtual host does not have (counted as empty), in that order.

    With the hand-off configured (``handoff``) or requests recorded, also
    ``"warehouse_requests": {"open", "oldest_open_age_seconds", "failed", "expired",
    "by_kind": {kind: {status: count}}}``: the requests to the warehouse system not yet
    answered (``pending``/``sending``) and the oldest one's age in seconds (null when none),
    those that need an operator (``fulfilment warehouse resend``), and every request by kind
    and status. Without either the key is absent, so that a service without the hand-off
    reports as before it.

    With ``reconcile_after_seconds`` given, and the hand-off configured or anything heard back
    from the warehouse, also ``"warehouse": {"shipments": {"by_source", "by_outcome"},
    "orders_shipped": {"in_part", "in_whole"}, "cancellations": {"by_source", "by_outcome"},
    "discrepancies": {kind: count}, "invalid_webhooks": {"kept", "replayed"},
    "orders_without_news"}``: the warehouse's shipments and cancellations recorded (webhook or
    poll), the orders its shipments took units from that still hold some (in part) or none
    (in whole), the discrepancies kept by kind, the invalid webhooks waiting for a replay and
    replayed (``adapters.postgres.warehouse_event_reads.warehouse_counts``), and the accepted
    fulfilment orders still holding units with no news for ``reconcile_after_seconds``, as the
    dispatcher's gauge ``fulfilment_warehouse_orders_without_news`` counts them.

    Raises:
        DatabaseUnavailableError, BrokerUnavailableError: a service does not answer.
    """
    async with stock_session(options.database, consumer=options.consumer) as stock:
        outcomes = await outcome_report(stock.engine)
        requests = PostgresWarehouseRequests(
            stock.engine, retry_budget_seconds=options.database.retry_budget_seconds
        )
        backlog = await requests.backlog()
        heard = None
        if reconcile_after_seconds is not None:
            # The dispatcher's own count, which its gauge reports.
            without_news = await requests.orders_without_news(reconcile_after_seconds)
            heard = (await warehouse_counts(stock.engine), without_news)
    by_reason: list[dict[str, Any]] = []
    dead_by_queue: dict[str, int] = {}
    pending: dict[str, dict[str, int]] = {}
    missing: list[str] = []
    async with connect(options.amqp_url) as connection:
        for subscribed in SUBSCRIBED_QUEUES:
            state = await queue_state(connection, subscribed.name)
            if state is None:
                missing.append(subscribed.name)
            pending[subscribed.name] = {
                "ready": state.ready if state else 0,
                "consumers": state.consumers if state else 0,
            }
        for name in DEAD_LETTER_QUEUES:
            # The depth first: browsed messages count as ready again only a moment after the
            # browsing channel has closed.
            dead_state = await queue_state(connection, name)
            if dead_state is None:
                missing.append(name)
            dead_by_queue[name] = dead_state.ready if dead_state else 0
            dead = await browse_dead_letters(connection, name)
            by_reason += [
                {"queue": name, "class": failure_class, "reason": reason, "count": count}
                for (failure_class, reason), count in sorted(dead.by_reason.items())
            ]
            if dead.unread:
                by_reason.append(
                    {
                        "queue": name,
                        "class": "unread",
                        "reason": "past 65,535",
                        "count": dead.unread,
                    }
                )
    details = asdict(outcomes)
    invariants = details.pop("invariants", {})
    shortage = details.pop("shortage", {})
    outbox_rows = details.pop("outbox", {})
    document: dict[str, Any] = {
        "outcomes": details,
        "dead_lettered": {
            "total": sum(dead_by_queue.values()),
            "by_queue": dead_by_queue,
            "by_reason": by_reason,
        },
        "pending": {
            "ready": sum(queue["ready"] for queue in pending.values()),
            "consumers": min(queue["consumers"] for queue in pending.values()),
            "by_queue": pending,
        },
        "outbox": outbox_rows,
        "invariants": {**invariants, "ok": outcomes.ok},
        "shortage": {**shortage, "examples": list(shortage.get("examples", ()))},
        "missing_queues": missing,
    }
    if handoff or backlog.by_kind_and_status:
        document["warehouse_requests"] = _requests_document(backlog)
    if heard is not None and (handoff or heard[0].any_recorded or heard[1]):
        document["warehouse"] = _warehouse_document(*heard)
    return document


def _warehouse_document(counts: WarehouseCounts, without_news: int) -> dict[str, Any]:
    return {
        "shipments": {
            "by_source": counts.shipments_by_source,
            "by_outcome": counts.shipments_by_outcome,
        },
        "orders_shipped": {
            "in_part": counts.orders_shipped_in_part,
            "in_whole": counts.orders_shipped_in_whole,
        },
        "cancellations": {
            "by_source": counts.cancellations_by_source,
            "by_outcome": counts.cancellations_by_outcome,
        },
        "discrepancies": counts.discrepancies_by_kind,
        "invalid_webhooks": {
            "kept": counts.invalid_webhooks_kept,
            "replayed": counts.invalid_webhooks_replayed,
        },
        "orders_without_news": without_news,
    }


def _requests_document(backlog: RequestBacklog) -> dict[str, Any]:
    by_kind: dict[str, dict[str, int]] = {}
    for (kind, status), count in sorted(backlog.by_kind_and_status.items()):
        by_kind.setdefault(str(kind), {})[str(status)] = count

    def with_status(status: RequestStatus) -> int:
        return sum(
            count for (_, each), count in backlog.by_kind_and_status.items() if each is status
        )

    return {
        "open": backlog.open_count,
        "oldest_open_age_seconds": backlog.oldest_open_age_seconds,
        "failed": with_status(RequestStatus.FAILED),
        "expired": with_status(RequestStatus.EXPIRED),
        "by_kind": by_kind,
    }


def render_report(document: dict[str, Any]) -> str:
    """The report for people: one fact per line, counts right-aligned."""
    lines = ["outcomes"]
    lines += [f"  {key:<28}{_value(value)}" for key, value in document["outcomes"].items()]
    dead = document["dead_lettered"]
    lines.append(f"dead-lettered{dead['total']:>25}")
    lines += [
        f"  {row['queue']}  {row['class']}: {row['reason'] or '-'}  {row['count']}"
        for row in dead["by_reason"]
    ]
    pending = document["pending"]
    lines.append(f"pending (ready in queues){pending['ready']:>13}")
    lines += [
        f"  {name:<28}{queue['ready']} ready, {queue['consumers']} consumer(s)"
        for name, queue in pending["by_queue"].items()
    ]
    outbox_rows = document["outbox"]
    lines.append("outbox (result events)")
    lines += [f"  {key:<28}{value}" for key, value in outbox_rows.items()]
    invariants = document["invariants"]
    lines.append("stock invariants               " + ("hold" if invariants["ok"] else "BROKEN"))
    lines += [f"  {key:<28}{_value(value)}" for key, value in invariants.items() if key != "ok"]
    shortage = document["shortage"]
    examples = ", ".join(shortage["examples"])
    lines.append(
        f"short SKUs (after a reported loss){shortage['skus']:>4}"
        + (f", {shortage['units']} units: {examples}" if shortage["skus"] else "")
    )
    requests = document.get("warehouse_requests")
    if requests is not None:
        age = requests["oldest_open_age_seconds"]
        oldest = "" if age is None else f", oldest {age:.0f} s"
        lines.append("warehouse requests")
        lines.append(f"  {'open':<28}{requests['open']}{oldest}")
        lines.append(f"  {'failed':<28}{requests['failed']}")
        lines.append(f"  {'expired':<28}{requests['expired']}")
        lines += [
            f"  {kind:<28}{_value(statuses)}" for kind, statuses in requests["by_kind"].items()
        ]
    heard = document.get("warehouse")
    if heard is not None:
        lines.append("warehouse (what it sent back)")
        lines.append(f"  {'shipments by source':<28}{_value(heard['shipments']['by_source'])}")
        lines.append(f"  {'shipments by outcome':<28}{_value(heard['shipments']['by_outcome'])}")
        shipped = heard["orders_shipped"]
        lines.append(
            f"  {'orders shipped':<28}in part {shipped['in_part']}, in whole {shipped['in_whole']}"
        )
        cancellations = heard["cancellations"]
        lines.append(f"  {'cancellations by source':<28}{_value(cancellations['by_source'])}")
        lines.append(f"  {'cancellations by outcome':<28}{_value(cancellations['by_outcome'])}")
        lines.append(f"  {'discrepancies':<28}{_value(heard['discrepancies'])}")
        invalid = heard["invalid_webhooks"]
        lines.append(
            f"  {'invalid webhooks':<28}kept {invalid['kept']}, replayed {invalid['replayed']}"
        )
        lines.append(f"  {'orders without news':<28}{heard['orders_without_news']}")
    # Zeros read from the wrong virtual host would look like a healthy, idle service.
    note = missing_queues_note(document.get("missing_queues", []))
    if note is not None:
        lines.append(note)
    return "\n".join(lines)


def _value(value: object) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
    if isinstance(value, list | tuple):
        return ", ".join(map(str, value)) or "-"
    return str(value)


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """Where each published event ended (product promise 1), and the stock invariants.

    Every event id, of any kind, must be in exactly one place: ``processed`` (the inbox: an
    order reserved, rejected or a duplicate of an order; a cancel or a shipment applied or
    ignored) or ``dead_lettered`` (in one of the DLQs; ``dead_lettered_by_queue`` says
    which). ``missing`` ones are lost; ``twice`` ones are both processed and dead-lettered (a
    dead letter whose original was processed after all, e.g. a replayed copy): not applied
    twice, but worth a look.
    """

    published: int
    processed: int
    dead_lettered: int
    missing: frozenset[UUID]
    twice: frozenset[UUID]
    invariants_hold: bool
    reserved_mismatches: int
    """SKUs whose ``reserved`` is not the sum of their reserved orders' lines: an order applied
    twice (or lost half-way) would show here."""
    dead_lettered_by_queue: dict[str, int] = field(default_factory=dict)
    """The published events in each DLQ, every DLQ named."""
    unread_dead_letters: int = 0
    """Dead letters past the first 65,535 of a DLQ, which the reconciliation could not read:
    a ``missing`` event may be among them (``fulfilment dlq show --id`` finds one)."""

    @property
    def ok(self) -> bool:
        """True when nothing is missing and the stock invariants hold."""
        return not self.missing and self.invariants_hold

    def describe(self) -> str:
        """One line for people."""
        unread = (
            f" ({self.unread_dead_letters} dead letters past the first 65,535 of a DLQ were"
            " not read: a missing event may be among them; `fulfilment dlq show --id` finds"
            " one)"
            if self.unread_dead_letters
            else ""
        )
        return (
            f"reconciled {self.published} published events: {self.processed} processed, "
            f"{self.dead_lettered} in the dead-letter queue, {len(self.missing)} missing"
            f"{unread}, {len(self.twice)} both processed and dead-lettered; stock invariants "
            + ("hold" if self.invariants_hold else "BROKEN")
        )


async def reconcile(options: ToolOptions, event_ids: Collection[UUID]) -> Reconciliation:
    """Check every id of ``event_ids`` against the inbox and the DLQs, and the invariants.

    The ids may be of events of any kind. The inbox is that of ``options.consumer``; every
    DLQ of the topology is read (without removing anything).

    Raises:
        DatabaseUnavailableError, BrokerUnavailableError: a service does not answer.
    """
    published = frozenset(event_ids)
    async with stock_session(options.database, consumer=options.consumer) as stock:
        processed = await processed_event_ids(stock, options.consumer, published)
        outcomes = await outcome_report(stock.engine)
    dead: dict[str, DeadLetterSummary] = {}
    async with connect(options.amqp_url) as connection:
        for name in DEAD_LETTER_QUEUES:
            dead[name] = await browse_dead_letters(connection, name)
    dead_in = {
        name: {UUID(value) for value in summary.event_ids if _is_uuid(value)} & published
        for name, summary in dead.items()
    }
    dead_ids = frozenset().union(*dead_in.values())
    return Reconciliation(
        published=len(published),
        processed=len(processed),
        dead_lettered=len(dead_ids),
        missing=published - processed - dead_ids,
        twice=frozenset(processed & dead_ids),
        invariants_hold=outcomes.ok,
        reserved_mismatches=outcomes.invariants.reserved_mismatches,
        dead_lettered_by_queue={name: len(ids) for name, ids in dead_in.items()},
        unread_dead_letters=sum(summary.unread for summary in dead.values()),
    )


def _is_uuid(value: str) -> bool:
    try:
        UUID(value)
    except ValueError:
        return False
    return True
