"""``fulfilment stock``: load, adjust, plan, or compare stock levels with the warehouse's."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Annotated

import typer

from fulfilment.domain.warehouse_events import AdjustmentReason
from fulfilment.entrypoints.cli.exits import fail, run
from fulfilment.entrypoints.cli.options import (
    OperatorOption,
    YesOption,
    settings_or_exit,
    tool_options,
)
from fulfilment.entrypoints.cli.typer_tweaks import Command, Group
from fulfilment.exit_codes import ExitCode
from fulfilment.tools.command import CommandError

app = typer.Typer(
    cls=Group,
    help="Stock levels: load them, adjust one, plan them from order data, or compare them with"
    " the warehouse's.",
    no_args_is_help=True,
)


@app.command("load", cls=Command)
def stock_load(
    file: Annotated[Path, typer.Argument(help="CSV with header sku,on_hand.")],
) -> None:
    """Upsert on-hand stock levels from FILE; nothing changes if any row is bad.

    The first load of absolute levels, run with the database **owner**'s
    ``FULFILMENT_DATABASE_URL`` as a deployment step (docs/security.md, "Least privilege");
    a change the warehouse or an operator finds afterwards is an adjustment (`stock adjust`).
    """
    from fulfilment.tools.stock_csv import load_command  # noqa: PLC0415 - see the module's text

    options = tool_options(settings_or_exit())
    run(load_command(options, file, echo=typer.echo))


# A negative DELTA (-3) looks like an option to click: an unknown "option" is taken as the
# argument it is (a mistyped real option then ends as an extra argument, refused all the same).
@app.command("adjust", cls=Command, context_settings={"ignore_unknown_options": True})
def stock_adjust(  # noqa: PLR0913 - the command's arguments and options
    sku: Annotated[str, typer.Argument(help="The SKU, as the warehouse names it.")],
    delta: Annotated[
        int,
        typer.Argument(help="Units onto the shelf (positive) or off it (negative, e.g. -3)."),
    ],
    *,
    reason: Annotated[
        AdjustmentReason,
        typer.Option(help="Why on hand changed, as the warehouse's adjustments say it."),
    ],
    comment: Annotated[
        str | None, typer.Option(help="What happened, for the audit (e.g. the count's ticket).")
    ] = None,
    yes: YesOption = False,
    operator: OperatorOption = None,
) -> None:
    """Change SKU's on hand by DELTA, once, audited; a dry run unless --yes.

    The rule of the warehouse's own adjustments: on hand never goes below 0 (the rest of a
    loss is kept as a discrepancy), a positive DELTA of an unknown SKU creates it, and a loss
    below what orders hold leaves the SKU short (no new order reserves it). It writes
    stock.adjusted (and stock.shortage when the shortfall changes). Use `stock load` for the
    first load of absolute levels, this for a change found afterwards (docs/design.md, "Stock
    that follows the warehouse").
    """
    from fulfilment.tools.stock_adjust import adjust_command  # noqa: PLC0415 - see the module's text

    options = tool_options(settings_or_exit())
    run(
        adjust_command(
            options,
            sku,
            delta,
            reason=reason,
            comment=comment,
            operator=operator,
            execute=yes,
            echo=typer.echo,
        )
    )


@app.command("plan", cls=Command)
def stock_plan(
    data: Annotated[list[Path], typer.Argument(help="Online Retail CSV files or folders.")],
    out: Annotated[Path, typer.Option(help="Where to write the sku,on_hand CSV.")],
) -> None:
    """Write deterministic stock levels for the orders in DATA (some short, a few unknown)."""
    from fulfilment.dataset.stock_plan import plan_command  # noqa: PLC0415 - see the module's text

    try:
        plan_command(data, out, echo=typer.echo)
    except CommandError as error:
        fail(str(error), error.exit_code)


@app.command("drift", cls=Command)
def stock_drift(
    *,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """The warehouse's on hand beside the service's, per SKU; changes nothing.

    Reads the service's stock_levels and the orders the warehouse has in one snapshot, then the
    warehouse's GET /inventory page by page (FULFILMENT_WAREHOUSE_URL, its token and CA, within
    FULFILMENT_WAREHOUSE_RATE_PER_SECOND). One line per SKU that differs: both counts, the
    difference (service minus warehouse), the units held by orders the warehouse has and those
    orders, and the state: in_flight when those orders can explain it (the warehouse shipped
    units the service has not heard of yet), else unexplained. Exits 1 after the report when a
    SKU is unexplained; 3 when the warehouse does not answer, 4 when it refuses the token.
    """
    # The warehouse's client and the dispatcher's rate cap, as the dispatcher builds them;
    # loaded by this command only.
    from fulfilment.adapters.warehouse.client import build_http_client  # noqa: PLC0415
    from fulfilment.dispatcher.service import rate_limiter  # noqa: PLC0415
    from fulfilment.entrypoints.dispatcher import client_options  # noqa: PLC0415
    from fulfilment.tools.stock_drift import drift_command  # noqa: PLC0415

    settings = settings_or_exit()
    if settings.warehouse.url is None:
        fail(
            "invalid settings: FULFILMENT_WAREHOUSE_URL is not set: there is no warehouse to"
            " compare with",
            ExitCode.BAD_INPUT,
        )
    try:
        http = build_http_client(client_options(settings.warehouse))
    except (OSError, ssl.SSLError) as error:
        fail(
            "invalid settings: FULFILMENT_WAREHOUSE_CA_FILE: cannot be read as a CA bundle:"
            f" {error}",
            ExitCode.BAD_INPUT,
        )

    async def drift() -> None:
        async with http:
            await drift_command(
                tool_options(settings),
                http,
                rate_limiter(settings.warehouse.rate_per_second),
                timeout_seconds=settings.warehouse.timeout_seconds,
                as_json=as_json,
                echo=typer.echo,
            )

    run(drift())
