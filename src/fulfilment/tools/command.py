"""What every command of the operator tools shares: its options, its output, its failures.

Each sub-command of ``fulfilment`` is one function of a module of this package (``*_command``),
which the command line (``fulfilment.entrypoints.cli``) calls with the options it built from the
settings and ``echo`` for standard output. A command that cannot do its job raises
:class:`CommandError`; the command line prints its reason on one line and exits with its code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fulfilment.exit_codes import ExitCode

if TYPE_CHECKING:
    # SQLAlchemy is imported with the engine's module: not before a command needs it.
    from fulfilment.adapters.postgres.engine import DatabaseOptions

Echo = Callable[[str], object]
"""Writes one line (or block) of a command's output."""


class CommandError(Exception):
    """A command cannot do its job; ``str(error)`` says why, ``exit_code`` is the exit status."""

    def __init__(self, reason: str, exit_code: ExitCode = ExitCode.FAILED) -> None:
        super().__init__(reason)
        self.exit_code = exit_code


@dataclass(frozen=True, slots=True)
class ToolOptions:
    """Where the tools find RabbitMQ and PostgreSQL, and whose inbox they read."""

    amqp_url: str = field(repr=False)
    """RabbitMQ URL, credentials and virtual host included (so kept out of ``repr``)."""
    database: DatabaseOptions
    """PostgreSQL's URL and time bounds."""
    consumer: str
    """The inbox namespace of the worker (``FULFILMENT_CONSUMER_NAME``)."""
