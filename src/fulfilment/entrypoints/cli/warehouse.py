"""``fulfilment warehouse``: the requests to the warehouse system; list, show or re-send them."""

from __future__ import annotations

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
    help="The requests to the warehouse system: list, show or re-send them.",
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
