"""What the commands of the operator tools share: the options the command line builds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # SQLAlchemy is imported with the engine's module: not before a command needs it.
    from fulfilment.adapters.postgres.engine import DatabaseOptions


@dataclass(frozen=True, slots=True)
class ToolOptions:
    """Where the tools find RabbitMQ and PostgreSQL, and whose inbox they read."""

    amqp_url: str = field(repr=False)
    """RabbitMQ URL, credentials and virtual host included (so kept out of ``repr``)."""
    database: DatabaseOptions
    """PostgreSQL's URL and time bounds."""
    consumer: str
    """The inbox namespace of the worker (``FULFILMENT_CONSUMER_NAME``)."""
