"""``fulfilment warehouse``: the kept invalid webhooks (list, show, replay) and the discrepancies.

A signed webhook that is no valid event of its type is answered 422 by the intake and kept
once per webhook id in ``invalid_webhooks`` (docs/design.md, "Hearing back from the
warehouse"). These commands read those rows and replay one: its kept body is parsed again
with this release's models, as the intake parses a request's body (:func:`parse_webhook`:
:class:`~fulfilment.contracts.warehouse_events.WebhookEnvelope`, then the model of its
``type``), and its command is applied through ``Stock.apply`` under the webhook's own id, so
that a webhook the sender also delivered again meanwhile is applied once. A replay follows
``dlq replay``: a dry run unless executed, one line per webhook and a summary, an audit row
(``invalid_webhook_audit``) with the operator, comment, OS user and host.

``discrepancies`` lists what the warehouse's shipments and cancellations named that their
order did not hold (``warehouse_discrepancies``).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fulfilment.adapters.postgres.admin import stock_session
from fulfilment.adapters.postgres.warehouse_event_reads import (
    Discrepancy,
    KeptWebhook,
    find_discrepancies,
    find_invalid_webhooks,
    get_invalid_webhook,
    record_replay,
)
from fulfilment.contracts.warehouse_webhooks import TAKEN, AnyWebhook
from fulfilment.domain.warehouse_events import (
    RecordAdjustment,
    RecordShipment,
    RecordWarehouseCancellation,
    Source,
)
from fulfilment.routes.handling import MalformedEventError, parse_event
from fulfilment.tools.command import CommandError, Echo, ToolOptions
from fulfilment.tools.dlq_commands import operator_identity

REASON_WIDTH = 70
"""Characters of a reason shown in the ``invalid-webhooks`` table."""


class TypeNotTakenError(Exception):
    """The body is a valid envelope of a ``type`` this release does not apply."""


def parse_webhook(
    body: bytes, *, webhook_id: str
) -> RecordShipment | RecordWarehouseCancellation | RecordAdjustment:
    """The command of a webhook's raw ``body``, read as the intake reads a request's body.

    Its ``type`` first (:class:`~fulfilment.contracts.warehouse_webhooks.AnyWebhook`), then the
    whole body with the model of that type (:data:`~fulfilment.contracts.warehouse_webhooks.TAKEN`),
    both with ``parse_event``'s strict JSON rules; the command carries ``webhook_id`` and
    :attr:`Source.WEBHOOK`.

    Raises:
        MalformedEventError: not a valid event of its type; the message says why, in one line.
        TypeNotTakenError: a ``type`` the service does not apply.
    """
    webhook_type = parse_event(AnyWebhook, body).type
    model = TAKEN.get(webhook_type)
    if model is None:
        msg = f"type {webhook_type!r} is not one the service applies"
        raise TypeNotTakenError(msg)
    event = parse_event(model, body)
    return event.data.to_command(webhook_id=webhook_id, source=Source.WEBHOOK)


async def list_invalid_command(
    options: ToolOptions, *, limit: int, replayed: bool, as_json: bool, echo: Echo
) -> None:
    """``fulfilment warehouse invalid-webhooks``: the kept webhooks, oldest first.

    Text: one line each (webhook id, type, received at, replayed or ``-``, reason clipped to
    :data:`REASON_WIDTH`), then how many of all these are. JSON: a list of
    :func:`webhook_document` without the body and headers. ``replayed`` lists the replayed
    ones too.

    Raises:
        DatabaseUnavailableError: PostgreSQL does not answer.
    """
    async with stock_session(options.database, consumer=options.consumer) as stock:
        kept, total = await find_invalid_webhooks(stock.engine, limit=limit, replayed=replayed)
    if as_json:
        echo(json.dumps([webhook_document(w, body=False) for w in kept], indent=2))
        return
    which = "kept" if replayed else "waiting for a replay"
    if not kept:
        echo(f"no invalid webhook is {which}")
        return
    width = max(len("WEBHOOK ID"), *(len(webhook.webhook_id) for webhook in kept))
    echo(f"{'WEBHOOK ID':<{width}}  {'TYPE':<26}  {'RECEIVED':<32}  {'REPLAYED':<16}  REASON")
    for webhook in kept:
        reason = " ".join(webhook.reason.split())
        if len(reason) > REASON_WIDTH:
            reason = reason[: REASON_WIDTH - 1] + "…"
        echo(
            f"{webhook.webhook_id:<{width}}  {webhook.type or '-':<26}"
            f"  {webhook.received_at.isoformat():<32}  {webhook.replay_outcome or '-':<16}"
            f"  {reason}"
        )
    echo(f"{len(kept)} of {total} invalid webhook(s) {which}, oldest first")


async def show_invalid_command(
    options: ToolOptions, webhook_id: str, *, as_json: bool, echo: Echo
) -> None:
    """``fulfilment warehouse invalid-webhook``: one kept webhook, headers and body included.

    Raises:
        CommandError: no webhook of that id is kept (exit 1).
        DatabaseUnavailableError: PostgreSQL does not answer.
    """
    async with stock_session(options.database, consumer=options.consumer) as stock:
        webhook = await get_invalid_webhook(stock.engine, webhook_id)
    if webhook is None:
        raise CommandError(_not_kept(webhook_id))
    if as_json:
        echo(json.dumps(webhook_document(webhook), indent=2))
    else:
        echo(render_webhook(webhook))


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What a replay did.

    ``outcome`` is the command's label (``shipped``, ``duplicate:webhook``, ...), None for a dry
    run; ``replayed_at`` when the row was marked, None unless executed.
    """

    webhook_id: str
    command: RecordShipment | RecordWarehouseCancellation | RecordAdjustment
    outcome: str | None = None
    replayed_at: datetime | None = None


async def replay_command(  # noqa: PLR0913 - each option of the command, by name
    options: ToolOptions,
    webhook_id: str,
    *,
    execute: bool,
    operator: str | None,
    comment: str | None,
    echo: Echo,
) -> ReplayResult:
    """``fulfilment warehouse replay-webhook``: apply a kept webhook, parsed with today's models.

    The kept body is parsed as the intake parses a request's (:func:`parse_webhook`); a dry
    run (``execute`` False) stops there and says which command it would apply. Executed, the
    command goes through ``Stock.apply`` (its webhook id recorded in ``webhook_inbox`` in the
    same transaction, so a webhook applied before under that id is answered as a duplicate),
    then the row is marked replayed with the outcome and the audit row written, in one
    transaction (``adapters.postgres.warehouse_event_reads.record_replay``). ``operator`` is the
    stated name (``--operator``), recorded beside the OS user and host.

    Raises:
        CommandError: no webhook of that id is kept, it was replayed already, its body is
            still not a valid event (the reason given; also when the stock store refuses its
            command, as the intake would), or its type is not one the service applies (exit 1;
            nothing changed).
        DatabaseUnavailableError: PostgreSQL does not answer.
        TransientError: the store failed past its retry budget (nothing applied).
    """
    async with stock_session(options.database, consumer=options.consumer) as stock:
        webhook = await get_invalid_webhook(stock.engine, webhook_id)
        if webhook is None:
            raise CommandError(_not_kept(webhook_id))
        if webhook.replayed_at is not None:
            msg = (
                f"webhook {webhook_id} was replayed already, at"
                f" {webhook.replayed_at.isoformat()} ({webhook.replay_outcome})"
            )
            raise CommandError(msg)
        try:
            command = parse_webhook(webhook.body, webhook_id=webhook_id)
        except (MalformedEventError, TypeNotTakenError) as error:
            msg = f"webhook {webhook_id} is still invalid, left as it was: {error}"
            raise CommandError(msg) from error
        if not execute:
            echo(f"replay (dry run): {webhook_id}  {_describe(command)}")
            echo("dry run: nothing changed (add --yes to do it)")
            return ReplayResult(webhook_id, command)
        try:
            # One branch per command: Stock.apply's outcome type follows its command's.
            match command:
                case RecordShipment():
                    outcome = (await stock.apply(command)).label
                case RecordAdjustment():
                    outcome = (await stock.apply(command)).label
                case _:
                    outcome = (await stock.apply(command)).label
        except ValueError as error:
            # The store refuses the command as it is (its route's check), as the intake does.
            msg = f"webhook {webhook_id} is still invalid, left as it was: {error}"
            raise CommandError(msg) from error
        replayed_at = await record_replay(
            stock.engine,
            webhook_id,
            outcome=outcome,
            operator=operator_identity(operator),
            comment=comment,
        )
    if replayed_at is None:
        # Another operator's replay marked it between the read and now: theirs is the audit
        # row; this apply was answered as a duplicate of theirs or took effect once.
        msg = f"webhook {webhook_id} was replayed by someone else meanwhile ({outcome})"
        raise CommandError(msg)
    echo(f"replayed: {webhook_id}  {_describe(command)}: {outcome}")
    return ReplayResult(webhook_id, command, outcome, replayed_at)


async def discrepancies_command(
    options: ToolOptions,
    *,
    kinds: tuple[str, ...],
    limit: int,
    as_json: bool,
    echo: Echo,
) -> None:
    """``fulfilment warehouse discrepancies``: the discrepancies of ``kinds`` (all), newest first.

    Text: one line each (id, kind, source and its id, order, SKU, quantity, order status,
    detected at), then how many of all these are. JSON: a list of :func:`discrepancy_document`.

    Raises:
        DatabaseUnavailableError: PostgreSQL does not answer.
    """
    async with stock_session(options.database, consumer=options.consumer) as stock:
        found, total = await find_discrepancies(stock.engine, limit=limit, kinds=kinds)
    if as_json:
        echo(json.dumps([discrepancy_document(d) for d in found], indent=2))
        return
    if not found:
        echo("no discrepancy is recorded" + (f" of kind {', '.join(kinds)}" if kinds else ""))
        return
    echo(
        f"{'ID':>6}  {'KIND':<18}  {'SOURCE':<12}  {'SOURCE ID':<20}  {'ORDER':<36}"
        f"  {'SKU':<12}  {'UNITS':>5}  {'STATUS':<9}  DETECTED"
    )
    for item in found:
        echo(
            f"{item.id:>6}  {item.kind:<18}  {item.source:<12}  {item.source_id:<20}"
            f"  {item.order_id or '-'!s:<36}  {item.sku or '-':<12}"
            f"  {'-' if item.quantity is None else item.quantity:>5}"
            f"  {item.order_status or '-':<9}  {item.detected_at.isoformat()}"
        )
    echo(f"{len(found)} of {total} discrepancies, newest first")


def webhook_document(webhook: KeptWebhook, *, body: bool = True) -> dict[str, Any]:
    """``webhook`` as JSON: every column; times ISO 8601.

    ``body`` is the raw body as text (``body_base64`` instead if it is not UTF-8), and
    ``headers`` the kept headers; both left out with ``body=False``.
    """
    document: dict[str, Any] = {
        "webhook_id": webhook.webhook_id,
        "type": webhook.type,
        "received_at": webhook.received_at.isoformat(),
        "reason": webhook.reason,
        "replayed_at": None if webhook.replayed_at is None else webhook.replayed_at.isoformat(),
        "replay_outcome": webhook.replay_outcome,
    }
    if body:
        document["headers"] = dict(webhook.headers)
        try:
            document["body"] = webhook.body.decode()
        except UnicodeDecodeError:
            document["body_base64"] = base64.b64encode(webhook.body).decode()
    return document


def render_webhook(webhook: KeptWebhook) -> str:
    """``webhook`` for people: one field a line, the headers, then the body as received."""
    document = webhook_document(webhook)
    lines = [
        f"{key + ':':<16}{'-' if document[key] is None else document[key]}"
        for key in ("webhook_id", "type", "received_at", "reason", "replayed_at", "replay_outcome")
    ]
    lines.append("headers:")
    lines += [f"  {name}: {value}" for name, value in sorted(document["headers"].items())]
    if "body" in document:
        lines.append(f"{'body:':<16}{document['body']}")
    else:
        lines.append(f"{'body_base64:':<16}{document['body_base64']} (not UTF-8)")
    return "\n".join(lines)


def discrepancy_document(item: Discrepancy) -> dict[str, Any]:
    """``item`` as JSON: every column; the order id as text, times ISO 8601."""
    return {
        "id": item.id,
        "kind": item.kind,
        "source": item.source,
        "source_id": item.source_id,
        "order_id": None if item.order_id is None else str(item.order_id),
        "sku": item.sku,
        "quantity": item.quantity,
        "order_status": item.order_status,
        "detected_at": item.detected_at.isoformat(),
    }


def _describe(command: RecordShipment | RecordWarehouseCancellation | RecordAdjustment) -> str:
    if isinstance(command, RecordAdjustment):
        return f"adjustment {command.adjustment_id} of {command.sku} ({command.delta:+d})"
    if isinstance(command, RecordShipment):
        units = ", ".join(f"{sku} x{quantity}" for sku, quantity in command.shipped().items())
        return f"shipment {command.shipment_id} of order {command.order_id} ({units})"
    cancelled = command.cancelled()
    units = (
        "everything it holds"
        if cancelled is None
        else ", ".join(f"{sku} x{quantity}" for sku, quantity in cancelled.items())
    )
    return f"cancellation {command.cancellation_id} of order {command.order_id} ({units})"


def _not_kept(webhook_id: str) -> str:
    return f"no invalid webhook is kept with the id {webhook_id!r}"
