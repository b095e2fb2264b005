"""``fulfilment demo``: the main job on real data, from a checkout.

The production wheel leaves ``fulfilment.demo`` out; the command imports it when it runs and
refuses in one line where it is missing (:data:`DEMO_NOT_INSTALLED`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fulfilment.entrypoints.cli.exits import fail, run
from fulfilment.entrypoints.cli.options import settings_or_exit, tool_options
from fulfilment.entrypoints.cli.typer_tweaks import Command
from fulfilment.exit_codes import ExitCode

app = typer.Typer()
"""Merged into ``fulfilment`` itself (added without a name): ``fulfilment demo``."""


DEMO_NOT_INSTALLED = (
    "the demo is not part of this installation (the production image leaves it out);"
    " run it from a checkout: make demo"
)
"""Why ``fulfilment demo`` exits 2 where the package ``fulfilment.demo`` is not installed."""


DEMO_INTERRUPTED = (
    "interrupted (Ctrl-C): the processes it started (worker, relay, warehouse simulator,"
    " dispatcher) are stopped; what they applied stays in the database, and events published"
    " but not consumed stay queued; run the demo again to go on (the events already applied"
    " are answered as duplicates), or make demo RESET=1 to start afresh"
)
"""What ``fulfilment demo`` leaves when Ctrl-C stops it: its child processes stop on the
signal (they share its process group) and on its own SIGTERM."""


@app.command(cls=Command)
def demo(
    data: Annotated[Path, typer.Argument(help="Folder (or file) of Online Retail CSVs.")] = Path(
        "data/sample/online-retail"
    ),
    reset: Annotated[  # noqa: FBT002 - a typer flag
        bool,
        typer.Option(
            help="Empty the service's tables and queues first: only a database the demo made"
            " or found empty, or one named with --confirm-reset."
        ),
    ] = False,
    confirm_reset: Annotated[
        str | None,
        typer.Option(
            "--confirm-reset",
            metavar="DATABASE",
            help="With --reset: empty this database although it is not the demo's (its name,"
            " as in FULFILMENT_DATABASE_URL).",
        ),
    ] = None,
) -> None:
    """The main job on real data: migrate, load stock, run the worker, publish, report.

    Needs the database **owner**'s ``FULFILMENT_DATABASE_URL`` (it migrates, loads stock and,
    with --reset, truncates), not the runtime role's. ``--reset`` refuses a database that
    holds rows the demo did not write (one it did not create, or find empty and mark in the
    database's comment) unless ``--confirm-reset`` names it; it prints what it removed, and
    records each dead letter it purges in ``dead_letter_audit``.

    Stock levels are planned from DATA deterministically, so some orders are rejected for
    insufficient stock and a few for unknown SKUs. Runs the worker as a child process and
    plays DATA day by day: the orders and the cancellations mapped to their order, in time
    order, each step settled before the next. The warehouse (a simulator, with ``fulfilment
    webhooks`` and the dispatcher beside it) ships the orders it received in one or more
    shipments and cancels a few lines, by signed webhooks, a few only found by the
    dispatcher's poll; each day waits for them and checks them, the statuses and the stock
    against the simulator's record (an order it never received ships with the shop's
    ``OrderShipped``). Stops the worker with SIGTERM and reconciles every published
    event of the three kinds. Runs the relay beside it and checks that the demo's queue on
    ``fulfilment.events`` (``fulfilment.demo.result-events``) received every result event the
    run wrote, valid and in order per order.
    """
    try:
        from fulfilment.demo.run import demo_command  # noqa: PLC0415 - see the module's text
    except ModuleNotFoundError as error:
        # The production wheel leaves the demo out (pyproject's wheel ``exclude``): its
        # --reset truncates the service's tables.
        if error.name != "fulfilment.demo":
            raise
        fail(DEMO_NOT_INSTALLED, ExitCode.BAD_INPUT)
    if confirm_reset is not None and not reset:
        fail(
            "--confirm-reset names the database --reset may empty: add --reset", ExitCode.BAD_INPUT
        )
    settings = settings_or_exit()
    code = run(
        demo_command(
            tool_options(settings),
            data,
            reset=reset,
            confirm_reset=confirm_reset,
            stop_grace_seconds=settings.deadlines.orchestrator_grace_period_seconds,
            echo=typer.echo,
        ),
        interrupted=DEMO_INTERRUPTED,
    )
    if code != 0:
        raise typer.Exit(code)
