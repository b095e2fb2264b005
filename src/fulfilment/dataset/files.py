"""The data set's files read for a command: their errors as the command's bad input."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from fulfilment.dataset.online_retail import OnlineRetailError, ReadResult, csv_files, read_orders
from fulfilment.dataset.retail_lifecycle import CancellationMatch, match_cancellations
from fulfilment.exit_codes import ExitCode
from fulfilment.tools.command import CommandError


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
