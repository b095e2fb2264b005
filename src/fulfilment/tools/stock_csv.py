"""Stock files: ``sku,on_hand`` CSVs read for ``fulfilment stock load`` (:func:`load_command`).

The format: UTF-8 (a byte-order mark is tolerated), a header that is exactly ``sku,on_hand``,
then one row per SKU. SKUs are the shop's stock codes and are kept as written (case and inner
spaces matter, as in ``15056bl`` and ``BANK CHARGES``) and must be ones an event could name
(``contracts.order_placed.sku_problem``); ``on_hand`` is a whole number of units.
Blank lines are skipped. Any other departure is an error naming the file and the line, so that
a bad file is refused before any level is changed.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from fulfilment.adapters.postgres.admin import stock_session
from fulfilment.adapters.postgres.errors import SKUS_SHOWN, StockBelowReservedError
from fulfilment.adapters.postgres.tables.base import INTEGER_MAX
from fulfilment.contracts.order_placed import shown_sku, sku_problem
from fulfilment.exit_codes import ExitCode
from fulfilment.tools.command import CommandError, Echo, ToolOptions
from fulfilment.utf8 import at_line, not_utf8

HEADER = ("sku", "on_hand")
"""The one accepted header row."""

MAX_ON_HAND = INTEGER_MAX
"""Largest ``on_hand`` the database column holds."""

_WHOLE_NUMBER = re.compile(r"[0-9]+")


class StockCsvError(ValueError):
    """A stock file cannot be used; ``str(error)`` reads ``FILE:LINE: what is wrong``.

    Attributes:
        path: the file, as given.
        line: the 1-based line number, or None when the whole file is at fault.
        problem: what is wrong, without the location.
    """

    def __init__(self, path: Path | str, line: int | None, problem: str) -> None:
        self.path = Path(path)
        self.line = line
        self.problem = problem
        super().__init__(at_line(path, line, problem))


async def load_command(options: ToolOptions, file: Path, *, echo: Echo) -> None:
    """``fulfilment stock load``: upsert the on-hand levels of ``file`` in one transaction.

    Nothing changes if any row is bad or any new level would fall below the units reserved.

    Raises:
        CommandError: the file cannot be read or holds a bad row, or a level would fall below
            its reserved units (exit 2).
        DatabaseUnavailableError: PostgreSQL does not answer.
    """
    try:
        levels, lines = read_stock_file(file)
    except StockCsvError as error:
        raise CommandError(str(error), ExitCode.BAD_INPUT) from error
    except OSError as error:
        # The bare "[Errno 2] No such file or directory: 'x'" names neither the command's
        # argument as given nor what to do.
        msg = f"{file}: cannot read the stock file: {error.strerror or error}"
        raise CommandError(msg, ExitCode.BAD_INPUT) from error
    try:
        async with stock_session(options.database, consumer=options.consumer) as stock:
            await stock.put_stock(levels)
    except StockBelowReservedError as error:
        raise CommandError(
            _below_reserved(file, levels, lines, error.skus), ExitCode.BAD_INPUT
        ) from error
    echo(f"loaded {len(levels)} stock level{'' if len(levels) == 1 else 's'} from {file}")


def _below_reserved(
    file: Path, levels: dict[str, int], lines: dict[str, int], skus: tuple[str, ...]
) -> str:
    """``FILE:LINE: ...`` for the first row, in file order, whose level the database refused."""
    rows = sorted(lines[sku] for sku in skus)
    first = next(sku for sku in skus if lines[sku] == rows[0])
    message = (
        f"{file}:{rows[0]}: on_hand {levels[first]} for {first!r} would fall below the units"
        " already reserved for it; nothing was loaded"
    )
    others = rows[1:]
    if others:
        shown = ", ".join(str(line) for line in others[: SKUS_SHOWN - 1])
        more = f" and {len(rows) - SKUS_SHOWN} more" if len(rows) > SKUS_SHOWN else ""
        message += f" (so would line{'s' if len(others) > 1 else ''} {shown}{more})"
    return message


def read_stock_csv(path: Path | str) -> dict[str, int]:
    """Read a stock file into ``{sku: on_hand}``, in file order (see :func:`read_stock_file`)."""
    return read_stock_file(path)[0]


def read_stock_file(path: Path | str) -> tuple[dict[str, int], dict[str, int]]:
    """Read a stock file into ``{sku: on_hand}`` and ``{sku: line}``, both in file order.

    Raises:
        StockCsvError: the file is not UTF-8 (the line of its first bad byte is named), its
            header is not exactly ``sku,on_hand``, or a row is bad: not two fields, a SKU the
            event contract refuses (``sku_problem``: empty, too long, white space around it, a
            line feed or a NUL), an ``on_hand`` that is not a whole number from 0 to
            :data:`MAX_ON_HAND`, or a SKU already seen (both lines are named).
        OSError: the file cannot be opened or read.
    """
    levels: dict[str, int] = {}
    first_line: dict[str, int] = {}
    with Path(path).open(encoding="utf-8-sig", newline="") as stream:
        reader = csv.reader(stream, strict=True)
        try:
            header = next(reader, None)
            if header is None or tuple(header) != HEADER:
                shown = "an empty file" if header is None else repr(",".join(header))
                raise StockCsvError(path, 1, f"header must be exactly 'sku,on_hand', got {shown}")
            ended = reader.line_num
            for row in reader:
                # A quoted field may span lines: a row is named by the line it starts on.
                line, ended = ended + 1, reader.line_num
                if not row:
                    continue
                sku, on_hand = _parse_row(path, line, row)
                if sku in first_line:
                    problem = f"duplicate SKU {sku!r} (first on line {first_line[sku]})"
                    raise StockCsvError(path, line, problem)
                first_line[sku] = line
                levels[sku] = on_hand
        except UnicodeDecodeError as error:
            # The stream decodes ahead of the reader, in chunks: the reader's line is not the
            # bad byte's.
            bad_line, problem = not_utf8(Path(path), error)
            raise StockCsvError(path, bad_line, problem) from None
        except csv.Error as error:
            raise StockCsvError(path, reader.line_num, f"malformed CSV ({error})") from None
    return levels, first_line


def _parse_row(path: Path | str, line: int, row: list[str]) -> tuple[str, int]:
    if len(row) != len(HEADER):
        problem = f"expected 2 fields (sku,on_hand), got {len(row)}"
        raise StockCsvError(path, line, problem)
    sku, on_hand = row
    if (refused := sku_problem(sku)) is not None:
        raise StockCsvError(path, line, f"sku {refused}, got {shown_sku(sku)}")
    if not _WHOLE_NUMBER.fullmatch(on_hand):
        problem = f"on_hand must be a whole number >= 0, got {on_hand!r}"
        raise StockCsvError(path, line, problem)
    # The length test first: int() refuses strings of thousands of digits with a ValueError.
    if len(on_hand.lstrip("0")) > len(str(MAX_ON_HAND)) or int(on_hand) > MAX_ON_HAND:
        problem = f"on_hand must be at most {MAX_ON_HAND}, got {on_hand!r}"
        raise StockCsvError(path, line, problem)
    return sku, int(on_hand)
