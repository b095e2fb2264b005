"""``fulfilment stock``: load stock levels, or plan them from order data."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fulfilment.entrypoints.cli.exits import fail, run
from fulfilment.entrypoints.cli.options import settings_or_exit, tool_options
from fulfilment.entrypoints.cli.typer_tweaks import Command, Group
from fulfilment.tools.command import CommandError

app = typer.Typer(
    cls=Group,
    help="Stock levels: load them, or plan them from order data.",
    no_args_is_help=True,
)


@app.command("load", cls=Command)
def stock_load(
    file: Annotated[Path, typer.Argument(help="CSV with header sku,on_hand.")],
) -> None:
    """Upsert on-hand stock levels from FILE; nothing changes if any row is bad.

    Needs the database **owner**'s ``FULFILMENT_DATABASE_URL``: the runtime role may change
    stock levels only through the reservation functions (docs/security.md, "Least privilege").
    """
    from fulfilment.tools.stock_csv import load_command  # noqa: PLC0415 - see the module's text

    options = tool_options(settings_or_exit())
    run(load_command(options, file, echo=typer.echo))


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
