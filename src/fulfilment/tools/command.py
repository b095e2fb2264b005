"""What every command of the operator tools shares: its options, its output, its failures.

Each sub-command of ``fulfilment`` is one function of a module of this package (``*_command``),
which the command line (``fulfilment.cli``) calls with the options it built from the settings
and ``echo`` for standard output. A command that cannot do its job raises
:class:`CommandError`; the command line prints its reason on one line and exits with its code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fulfilment.exit_codes import ExitCode
from fulfilment.tools.online_retail import OnlineRetailError, ReadResult, csv_files, read_orders
from fulfilment.tools.retail_lifecycle import CancellationMatch, match_cancellations

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


def read_order_files(paths: Iterable[Path]) -> ReadResult:
    """The orders of the Online Retail CSV files among ``paths`` (files, or folders of them).

    Raises:
        CommandError: a path or file cannot be read, or holds bad data (exit 2).
    """
    try:
        return read_orders([file for path in paths for file in csv_files(path)])
    except (OnlineRetailError, OSError) as error:
        raise CommandError(str(error), ExitCode.BAD_INPUT) from error


def match_read_cancellations(read: ReadResult) -> CancellationMatch:
    """The cancellations of ``read`` mapped to their orders (``retail_lifecycle``).

    Raises:
        CommandError: a mapped cancellation does not fit an event (exit 2).
    """
    try:
        return match_cancellations(read.orders, read.cancellations)
    except OnlineRetailError as error:
        raise CommandError(str(error), ExitCode.BAD_INPUT) from error
