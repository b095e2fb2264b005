"""``fulfilment warehouse``: list, show and re-send the requests to the warehouse system.

The requests are the rows of ``warehouse_requests`` that the worker records and the
dispatcher sends (``fulfilment.application.ports.WarehouseRequests``). These commands read
them through the same port and re-send a ``failed`` or ``expired`` one: back to ``sending``,
due now, with the same idempotency key and the same body bytes, one audit row each
(``warehouse_request_audit``), as ``fulfilment dlq replay`` writes ``dead_letter_audit``.

``resend`` follows ``dlq replay``: a dry run unless executed, one line per request and a
summary, keys that match no request exit 1 in one line, and an executed run that refused
some exits 1 after the summary.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import AsyncIterator, Collection, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from fulfilment.adapters.postgres.admin import stock_session
from fulfilment.adapters.postgres.warehouse_requests import PostgresWarehouseRequests
from fulfilment.application.ports import WarehouseRequests
from fulfilment.domain.handoff import RequestRecord, RequestStatus
from fulfilment.tools.command import CommandError, Echo, ToolOptions
from fulfilment.tools.dlq_commands import operator_identity

RESENDABLE = frozenset({RequestStatus.FAILED, RequestStatus.EXPIRED})
"""The statuses a request may be re-sent from (the port's ``resend``)."""

UNSETTLED = (
    RequestStatus.PENDING,
    RequestStatus.SENDING,
    RequestStatus.FAILED,
    RequestStatus.EXPIRED,
)
"""What ``list`` shows without ``--status``: every request the warehouse has not settled,
those still on their way and those that need an operator."""


@contextlib.asynccontextmanager
async def requests_store(options: ToolOptions) -> AsyncIterator[WarehouseRequests]:
    """The requests' store on a fresh engine, checked reachable, disposed on exit.

    Raises:
        DatabaseUnavailableError: the server does not answer, or (a ``DatabaseRefusedError``)
            refuses the user or has no such database.
    """
    async with stock_session(options.database, consumer=options.consumer) as stock:
        yield PostgresWarehouseRequests(
            stock.engine, retry_budget_seconds=options.database.retry_budget_seconds
        )


async def list_command(
    options: ToolOptions,
    statuses: Collection[RequestStatus],
    *,
    limit: int,
    as_json: bool,
    echo: Echo,
) -> None:
    """``fulfilment warehouse list``: at most ``limit`` requests in ``statuses``, oldest first.

    Text: one line per request (key, kind, status, attempts, last status code, created at,
    order), then how many of all the requests in those statuses were shown. JSON: a list of
    :func:`request_document` without the body.

    Raises:
        DatabaseUnavailableError: PostgreSQL does not answer.
    """
    chosen = tuple(statuses) or UNSETTLED
    async with requests_store(options) as store:
        records = await store.find(chosen, limit)
        backlog = await store.backlog()
    if as_json:
        echo(json.dumps([request_document(r, body=False) for r in records], indent=2))
        return
    total = sum(
        count for (_, status), count in backlog.by_kind_and_status.items() if status in chosen
    )
    names = ", ".join(str(status) for status in chosen)
    if not records:
        echo(f"no warehouse request is {names}")
        return
    echo(
        f"{'KEY':<36}  {'KIND':<16}  {'STATUS':<9}  {'ATTEMPTS':>8}  {'CODE':>4}"
        f"  {'CREATED':<32}  ORDER"
    )
    for record in records:
        code = "-" if record.last_status_code is None else str(record.last_status_code)
        echo(
            f"{record.idempotency_key!s:<36}  {record.kind:<16}  {record.status:<9}"
            f"  {record.attempts:>8}  {code:>4}  {record.created_at.isoformat():<32}"
            f"  {record.order_id}"
        )
    echo(f"{len(records)} of {total} request(s) {names}, oldest first")


async def show_command(
    options: ToolOptions, keys: Sequence[UUID], *, as_json: bool, echo: Echo
) -> None:
    """``fulfilment warehouse show``: every column of each request, the frozen body included.

    Raises:
        CommandError: a key matches no request (exit 1; nothing shown).
        DatabaseUnavailableError: PostgreSQL does not answer.
    """
    async with requests_store(options) as store:
        records = [await store.get(key) for key in _unique(keys)]
    unknown = [key for key, record in zip(_unique(keys), records, strict=True) if record is None]
    if unknown:
        raise CommandError(_no_request(unknown))
    found = [record for record in records if record is not None]
    if as_json:
        echo(json.dumps([request_document(record) for record in found], indent=2))
    else:
        echo("\n\n".join(render_request(record) for record in found))


async def resend_command(
    options: ToolOptions,
    keys: Sequence[UUID],
    *,
    execute: bool,
    operator: str | None,
    echo: Echo,
) -> None:
    """``fulfilment warehouse resend``: send failed or expired requests again, same key and body.

    Each request is echoed as it goes: ``resent``, ``resend (dry run)``, or ``refused: <why>``
    (not failed or expired; no such key among others that exist; or, executed, a fulfilment
    order whose order is no longer reserved or had cancels applied locally, which the store
    refuses: its body would hand the warehouse units the order no longer holds). Then one
    summary line. ``operator`` is the stated name (``--operator``); the audit row's
    ``operator`` holds it beside the OS user and host (``alice (bob@host)``, or ``bob@host``
    without one), and the database adds its session role (``database_user``).

    Raises:
        CommandError: no key matches a request (exit 1, nothing done), or, executed, some
            were refused (exit 1, after the summary; those are unchanged).
        DatabaseUnavailableError: PostgreSQL does not answer.
    """
    wanted = _unique(keys)
    who = operator_identity(operator)
    seat = f"{who.os_user}@{who.host}"
    audited_as = f"{who.stated} ({seat})" if who.stated else seat
    done = refused = 0
    async with requests_store(options) as store:
        records = [await store.get(key) for key in wanted]
        if all(record is None for record in records):
            raise CommandError(_no_request(wanted))
        for key, record in zip(wanted, records, strict=True):
            if record is None:
                echo(f"refused: {key}: no such request")
                refused += 1
            elif record.status not in RESENDABLE:
                echo(f"refused: {_describe(record)}: only failed or expired requests are re-sent")
                refused += 1
            elif not execute:
                echo(f"resend (dry run): {_describe(record)}")
            elif await store.resend(key, operator=audited_as):
                echo(f"resent: {_describe(record)}")
                done += 1
            else:
                echo(
                    f"refused: {_describe(record)}: its order is no longer reserved as the body"
                    " says, or the status changed meanwhile (fulfilment warehouse show)"
                )
                refused += 1
    refusals = f", {refused} refused (unchanged)" if refused else ""
    if not execute:
        echo(
            f"dry run: {len(wanted) - refused} request(s) would be re-sent{refusals};"
            " nothing changed (add --yes to do it)"
        )
        return
    echo(f"resent {done} of {len(wanted)} request(s){refusals}")
    if refused:
        # Not everything asked for was done: a script running the re-send must see it.
        msg = f"{refused} request(s) refused (the lines above say why), left as they were"
        raise CommandError(msg)


def request_document(record: RequestRecord, *, body: bool = True) -> dict[str, Any]:
    """``record`` as JSON: every column; times ISO 8601; lines ``[{"sku", "quantity"}]``.

    ``body`` is the frozen body as text (``body_base64`` instead if it is not UTF-8), None
    before the first attempt; left out with ``body=False``.
    """
    document: dict[str, Any] = {
        "idempotency_key": str(record.idempotency_key),
        "kind": str(record.kind),
        "order_id": str(record.order_id),
        "causation_id": str(record.causation_id),
        "status": str(record.status),
        "attempts": record.attempts,
        "created_at": record.created_at.isoformat(),
        "first_attempt_at": _time(record.first_attempt_at),
        "last_attempt_at": _time(record.last_attempt_at),
        "next_attempt_at": record.next_attempt_at.isoformat(),
        "answered_at": _time(record.answered_at),
        "warehouse_id": record.warehouse_id,
        "last_status_code": record.last_status_code,
        "last_answer": record.last_answer,
        "lines": None
        if record.lines is None
        else [{"sku": line.sku, "quantity": line.quantity} for line in record.lines],
        "traceparent": record.traceparent,
    }
    if body:
        text = _body_text(record.body)
        if text is None and record.body is not None:
            document["body_base64"] = base64.b64encode(record.body).decode()
        else:
            document["body"] = text
    return document


def render_request(record: RequestRecord) -> str:
    """``record`` for people: one field a line, then the body sent, as it was sent."""
    document = request_document(record)
    fields = {key: value for key, value in document.items() if key not in {"body", "lines"}}
    lines = [f"{key + ':':<18}{'-' if value is None else value}" for key, value in fields.items()]
    held = document["lines"]
    lines.append(
        f"{'lines:':<18}"
        + (
            "the whole order"
            if held is None
            else ", ".join(f"{line['sku']} x{line['quantity']}" for line in held)
        )
    )
    if record.body is None:
        lines.append(f"{'body:':<18}- (never sent; built from the lines at the first attempt)")
    else:
        lines.append(f"{'body:':<18}{document.get('body') or document.get('body_base64')}")
    return "\n".join(lines)


def _describe(record: RequestRecord) -> str:
    return (
        f"{record.idempotency_key}  {record.kind}  order {record.order_id}  {record.status},"
        f" {record.attempts} attempt(s)"
    )


def _body_text(body: bytes | None) -> str | None:
    if body is None:
        return None
    try:
        return body.decode()
    except UnicodeDecodeError:
        return None


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _unique(keys: Sequence[UUID]) -> list[UUID]:
    """``keys`` in the order given, each once."""
    return list(dict.fromkeys(keys))


def _no_request(keys: Sequence[UUID]) -> str:
    return f"no warehouse request has the key {', '.join(str(key) for key in keys)}"
