"""The ``fulfilment`` command: the operator tools' composition root.

Each sub-command parses its arguments, reads the settings, builds the options its tool needs,
and calls one function of ``fulfilment.tools`` (a ``*_command``); ``worker`` runs the worker's
own root, ``fulfilment.entrypoints.worker``.

Every sub-command exits 0 on success and otherwise prints one line, ``fulfilment: <reason>``,
on standard error and exits non-zero: 1 for a failed run or broken invariants, 2 for bad input
or settings, 3 for an unreachable service, 4 for a service that refused the user or has no
such virtual host or database. A group called without a command (``fulfilment``,
``fulfilment stock``, ``fulfilment dlq``, ``fulfilment warehouse``) prints its help and exits
2, as a usage error.

The help is the commands' docstrings read as Markdown, so that ``code`` shows as code, not
between backticks, and a paragraph is filled to the terminal's width.

One module per group of commands: ``services`` (worker, relay, dispatcher), ``database``
(prune, migrate), ``events`` (publish, report, reconcile), ``demo``, and the groups ``stock``,
``dlq``, ``outbox`` and ``warehouse``; ``exits`` maps the tools' errors to exit codes,
``options`` reads the settings, ``typer_tweaks`` holds the classes every command is built with.
Each module defines a typer app; this one adds them to :data:`app`, in the order the help lists
them.

The tools are imported by the command that runs them: imported here, SQLAlchemy, alembic and
aio-pika would load for every command, ``--help`` included (more than three times its
start-up time).
"""

from __future__ import annotations

from typing import Annotated

import typer

from fulfilment import __version__
from fulfilment.entrypoints.cli import (
    database,
    demo,
    dlq,
    events,
    outbox,
    services,
    stock,
    warehouse,
)
from fulfilment.entrypoints.cli.typer_tweaks import Group

app = typer.Typer(
    cls=Group,
    name="fulfilment",
    help="Order fulfilment: reserves, releases and ships stock on order events, once per event,"
    " and tells the rest of the shop through result events.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Every help text below is read as Markdown (the sub-groups and commands inherit it).
    rich_markup_mode="markdown",
)
# Added without a name, the commands of a module are ``fulfilment``'s own.
app.add_typer(services.app)
app.add_typer(database.app)
app.add_typer(events.app)
app.add_typer(demo.app)
app.add_typer(stock.app, name="stock")
app.add_typer(dlq.app, name="dlq")
app.add_typer(outbox.app, name="outbox")
app.add_typer(warehouse.app, name="warehouse")


def _print_version(value: bool) -> None:  # noqa: FBT001 - typer passes the flag's value
    if value:
        typer.echo(f"fulfilment {__version__}")
        raise typer.Exit


@app.callback()
def root(
    *,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Options of ``fulfilment`` itself, before any command (``fulfilment --version``)."""
