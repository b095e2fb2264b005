"""The long-running services: ``fulfilment worker``, ``relay``, ``dispatcher`` and ``webhooks``.

Each is its own root under ``fulfilment.entrypoints``; each command imports its service's
root when it runs, which keeps the other commands' start fast.
"""

from __future__ import annotations

import typer

from fulfilment.entrypoints.cli.typer_tweaks import Command

app = typer.Typer()
"""Merged into ``fulfilment`` itself (added without a name): ``fulfilment worker``, ..."""


@app.command(cls=Command)
def worker() -> None:
    """Run the worker until SIGTERM or SIGINT (the same as ``python -m fulfilment``)."""
    from fulfilment.entrypoints.worker import main  # noqa: PLC0415 - keeps the other commands' start fast

    main()


@app.command(cls=Command)
def relay() -> None:
    """Publish the outbox's result events to ``fulfilment.events`` until SIGTERM or SIGINT.

    One replica at a time publishes (it holds a PostgreSQL advisory lock); the others stand by.
    """
    from fulfilment.entrypoints.relay import main  # noqa: PLC0415 - keeps the other commands' start fast

    main()


@app.command(cls=Command)
def dispatcher() -> None:
    """Send the recorded requests to the warehouse system until SIGTERM or SIGINT.

    Needs ``FULFILMENT_WAREHOUSE_URL`` (else exit 2). One replica at a time sends (it holds a
    PostgreSQL advisory lock); the others stand by.
    """
    from fulfilment.entrypoints.dispatcher import main  # noqa: PLC0415 - keeps the other commands' start fast

    main()


@app.command(cls=Command)
def webhooks() -> None:
    """Receive the warehouse's signed webhooks until SIGTERM or SIGINT.

    ``POST /webhooks/warehouse`` on ``FULFILMENT_WEBHOOKS_PORT``, the probes and metrics on
    ``FULFILMENT_WEBHOOKS_HTTP_PORT``. Needs ``FULFILMENT_WAREHOUSE_WEBHOOK_SECRETS`` (else exit
    2). Every replica serves.
    """
    from fulfilment.entrypoints.webhooks import main  # noqa: PLC0415 - keeps the other commands' start fast

    main()
