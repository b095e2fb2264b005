"""Publish order events from a data set, then count and check what the service made of them.

``fulfilment publish``, ``fulfilment report`` and ``fulfilment reconcile``.

``publish`` and ``reconcile`` import the data set's reader (``fulfilment.dataset``) when they
run; ``report`` never loads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fulfilment.entrypoints.cli.exits import run
from fulfilment.entrypoints.cli.options import settings_or_exit, tool_options
from fulfilment.entrypoints.cli.typer_tweaks import Command

app = typer.Typer()
"""Merged into ``fulfilment`` itself (added without a name): ``fulfilment publish``, ..."""


@app.command(cls=Command)
def publish(
    files: Annotated[
        list[Path], typer.Argument(metavar="FILE", help="Online Retail CSV files or folders.")
    ],
    cancellations: Annotated[  # noqa: FBT002 - a typer flag
        bool,
        typer.Option(
            "--cancellations",
            help="Also an OrderCancelled per cancellation that can only mean one order.",
        ),
    ] = False,
) -> None:
    """Publish one OrderPlaced per invoice of FILES, persistent and confirmed.

    Ids derive from the invoice number, so publishing a file twice re-sends the same events
    (and the worker answers them as duplicates). Cancellations and non-positive lines are
    skipped and counted; with --cancellations, the cancellations mapped to an order are
    published among the orders, in time order, and the others counted by reason.
    """
    from fulfilment.dataset.publish import publish_command  # noqa: PLC0415 - see the module's text

    settings = settings_or_exit()
    run(
        publish_command(
            settings.broker.amqp_url.get_secret_value(),
            files,
            cancellations=cancellations,
            echo=typer.echo,
        ),
        interrupted="interrupted (Ctrl-C): the events the broker confirmed stay published;"
        " publish the same files again to send the rest (ids derive from the invoices, so the"
        " worker answers those it has as duplicates)",
    )


@app.command(cls=Command)
def report(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,  # noqa: FBT002 - a typer flag
) -> None:
    """Outcome counts, dead letters by reason, pending messages, and the stock invariants.

    With the hand-off to the warehouse system (``FULFILMENT_WAREHOUSE_URL`` set, or requests
    recorded), also the requests by kind and status, how many are open and the oldest one's
    age, and how many failed or expired; and what the warehouse sent back: its shipments (by
    source), the orders shipped in part and in whole, its cancellations, the discrepancies by
    kind, the invalid webhooks kept and replayed, and the fulfilment orders without news past
    FULFILMENT_WAREHOUSE_RECONCILE_AFTER_SECONDS. Exits 1 when an invariant does not hold.
    """
    from fulfilment.tools.report import report_command  # noqa: PLC0415 - see the module's text

    settings = settings_or_exit()
    run(
        report_command(
            tool_options(settings),
            as_json=as_json,
            echo=typer.echo,
            handoff=settings.warehouse.url is not None,
            reconcile_after_seconds=settings.warehouse.reconcile_after_seconds,
        )
    )


@app.command(cls=Command)
def reconcile(
    files: Annotated[
        list[Path], typer.Argument(metavar="FILE", help="Online Retail CSVs that were published.")
    ],
    cancellations: Annotated[  # noqa: FBT002 - a typer flag
        bool,
        typer.Option(
            "--cancellations",
            help="Also the OrderCancelled of each cancellation mapped to an order, as"
            " `publish --cancellations` and `demo` send them.",
        ),
    ] = False,
    shipments: Annotated[  # noqa: FBT002 - a typer flag
        bool,
        typer.Option(
            "--shipments",
            help="Also the OrderShipped of each order now reserved or shipped that no"
            " shipment of the warehouse shipped, as `demo` sends them at the end of each day.",
        ),
    ] = False,
) -> None:
    """Check that every event published from FILES is processed or dead-lettered, exactly once.

    Checks the OrderPlaced of every order; with --cancellations and --shipments, the other
    two kinds too, one line per kind. Exits 1 when an event is missing or a stock invariant
    does not hold.
    """
    from fulfilment.dataset.reconcile import reconcile_command  # noqa: PLC0415 - see the module's text

    options = tool_options(settings_or_exit())
    run(
        reconcile_command(
            options, files, cancellations=cancellations, shipments=shipments, echo=typer.echo
        )
    )
