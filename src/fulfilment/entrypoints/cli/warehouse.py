"""``fulfilment warehouse``: the requests to the warehouse system, and what it sent back.

The requests: list, show, re-send. What it sent back that needs an operator: the kept invalid
webhooks (list, show, replay) and the discrepancies (list).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated
from uuid import UUID

import typer

from fulfilment.domain.handoff import RequestStatus
from fulfilment.entrypoints.cli.exits import fail, run
from fulfilment.entrypoints.cli.options import (
    OperatorOption,
    YesOption,
    settings_or_exit,
    tool_options,
)
from fulfilment.entrypoints.cli.typer_tweaks import Command, Group
from fulfilment.exit_codes import ExitCode

app = typer.Typer(
    cls=Group,
    no_args_is_help=True,
    help="The requests to the warehouse system (list, show, re-send them), the invalid webhooks"
    " it sent (list, show, replay them) and the discrepancies of its shipments and"
    " cancellations.",
)


KeysArgument = Annotated[
    list[str],
    typer.Argument(
        metavar="KEY", help="Idempotency keys (UUIDs) as `fulfilment warehouse list` shows them."
    ),
]


@app.command("list", cls=Command)
def warehouse_list(
    *,
    statuses: Annotated[
        list[RequestStatus] | None,
        typer.Option(
            "--status",
            metavar="STATUS",
            help="Only requests in this status (pending, sending, accepted, refused, failed,"
            " withdrawn, expired); repeat for several. Default: pending, sending, failed and"
            " expired, every one the warehouse has not settled.",
        ),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """The requests to the warehouse system in the chosen statuses, oldest first.

    One line each: idempotency key, kind, status, attempts, the last HTTP status code, when it
    was recorded, and its order; then how many of all the requests in those statuses these are.
    Reads, changes nothing.
    """
    from fulfilment.tools.warehouse_requests import list_command  # noqa: PLC0415 - see the module's text

    options = tool_options(settings_or_exit())
    run(list_command(options, statuses or (), limit=limit, as_json=as_json, echo=typer.echo))


@app.command("show", cls=Command)
def warehouse_show(
    keys: KeysArgument,
    *,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Everything about the requests with these keys, the body sent included.

    Kind, order, status, attempts, times, the warehouse's id, the last HTTP status code and
    answer, the lines, and the body: the exact bytes sent, frozen at the first attempt (none
    before). A key that matches no request exits 1.
    """
    from fulfilment.tools.warehouse_requests import show_command  # noqa: PLC0415 - see the module's text

    uuids = _request_keys(keys)
    options = tool_options(settings_or_exit())
    run(show_command(options, uuids, as_json=as_json, echo=typer.echo))


@app.command("resend", cls=Command)
def warehouse_resend(
    keys: KeysArgument,
    *,
    yes: YesOption = False,
    operator: OperatorOption = None,
) -> None:
    """Send failed or expired requests again, with the same idempotency key and the same body.

    Each goes back to ``sending``, due now; the dispatcher sends it at its next turn. Any other
    status is refused, and so is a fulfilment order whose order is no longer reserved (its body
    would hand the warehouse units the order no longer holds). Each re-send writes a row of
    ``warehouse_request_audit`` (who, when, the status before). A dry run unless --yes; exits 1
    when no key matches a request, or when --yes refused some (after the summary).
    """
    from fulfilment.tools.warehouse_requests import resend_command  # noqa: PLC0415 - see the module's text

    uuids = _request_keys(keys)
    options = tool_options(settings_or_exit())
    run(resend_command(options, uuids, execute=yes, operator=operator, echo=typer.echo))


WebhookIdArgument = Annotated[
    str,
    typer.Argument(
        metavar="WEBHOOK_ID",
        help="The webhook-id of a kept webhook, as `fulfilment warehouse invalid-webhooks`"
        " shows it.",
    ),
]


@app.command("invalid-webhooks", cls=Command)
def warehouse_invalid_webhooks(
    *,
    replayed: Annotated[
        bool, typer.Option("--replayed", help="Also those replayed already.")
    ] = False,
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """The signed webhooks kept as invalid (answered 422) that wait for a replay, oldest first.

    One line each: webhook id, type, when it was received, the replay's outcome (- while it
    waits) and the reason; then how many of all these are. Reads, changes nothing.
    """
    from fulfilment.tools.warehouse_webhooks import list_invalid_command  # noqa: PLC0415 - see the module's text

    options = tool_options(settings_or_exit())
    run(
        list_invalid_command(
            options, limit=limit, replayed=replayed, as_json=as_json, echo=typer.echo
        )
    )


@app.command("invalid-webhook", cls=Command)
def warehouse_invalid_webhook(
    webhook_id: WebhookIdArgument,
    *,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Everything about one kept webhook: the reason, its headers and its body as received.

    The headers are the request's, without webhook-signature. An id that is not kept exits 1.
    """
    from fulfilment.tools.warehouse_webhooks import show_invalid_command  # noqa: PLC0415 - see the module's text

    options = tool_options(settings_or_exit())
    run(show_invalid_command(options, webhook_id, as_json=as_json, echo=typer.echo))


@app.command("replay-webhook", cls=Command)
def warehouse_replay_webhook(
    webhook_id: WebhookIdArgument,
    *,
    yes: YesOption = False,
    operator: OperatorOption = None,
    comment: Annotated[
        str | None, typer.Option(help="Why, for the audit table (e.g. the fix's version).")
    ] = None,
) -> None:
    """Apply a kept webhook, its body parsed again with this release's models.

    For a webhook an older release could not read (a new field, a new version), once this one
    can. The body is read as the endpoint reads a request's; one that is still invalid exits 1
    with the reason, unchanged. Applied under its own webhook id, so a webhook the warehouse
    delivered again meanwhile is answered as a duplicate, never applied twice. The row is
    marked replayed with the outcome, and a row of invalid_webhook_audit says who (--operator,
    the OS user and host), when and why (--comment). A dry run unless --yes.
    """
    from fulfilment.tools.warehouse_webhooks import replay_command  # noqa: PLC0415 - see the module's text

    options = tool_options(settings_or_exit())
    run(
        replay_command(
            options,
            webhook_id,
            execute=yes,
            operator=operator,
            comment=comment,
            echo=typer.echo,
        )
    )


class DiscrepancyKind(StrEnum):
    """The kinds of discrepancy (``warehouse_discrepancies.kind``), for ``--kind``."""

    UNKNOWN_ORDER = "unknown_order"
    ORDER_NOT_RESERVED = "order_not_reserved"
    MORE_THAN_HELD = "more_than_held"
    SKU_NOT_HELD = "sku_not_held"


@app.command("discrepancies", cls=Command)
def warehouse_discrepancies(
    *,
    kinds: Annotated[
        list[DiscrepancyKind] | None,
        typer.Option(
            "--kind",
            metavar="KIND",
            help="Only this kind (unknown_order, order_not_reserved, more_than_held,"
            " sku_not_held); repeat for several. Default: every kind.",
        ),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """What the warehouse's shipments and cancellations named that their order did not hold.

    One line each, newest first: kind, the shipment or cancellation and its id, the order, the
    SKU and units (none for a whole order), the order's status then, and when; then how many
    of all these are. Reads, changes nothing.
    """
    from fulfilment.tools.warehouse_webhooks import discrepancies_command  # noqa: PLC0415 - see the module's text

    options = tool_options(settings_or_exit())
    run(
        discrepancies_command(
            options,
            kinds=tuple(str(kind) for kind in kinds or ()),
            limit=limit,
            as_json=as_json,
            echo=typer.echo,
        )
    )


def _request_keys(keys: list[str]) -> list[UUID]:
    """``keys`` as UUIDs, or exit 2 naming the first that is not one.

    Typed ``str`` on the command line, not ``UUID``, so that the help and the runbook may
    write ``KEY``: the check is here, with the command's one-line failure.
    """
    uuids = []
    for key in keys:
        try:
            uuids.append(UUID(key))
        except ValueError:
            fail(f"not an idempotency key (a UUID): {key!r}", ExitCode.BAD_INPUT)
    return uuids
