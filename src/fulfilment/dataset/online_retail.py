"""Read the Online Retail CSV files and turn each invoice into one ``OrderPlaced`` v1 event.

The files are the real order lines of a UK gift-ware shop, one file per trading day (see
``data/sample/README.md``), with the header::

    InvoiceNo,StockCode,Description,Quantity,InvoiceDate,UnitPrice,CustomerID,Country

Only ``InvoiceNo``, ``StockCode``, ``Quantity``, ``InvoiceDate`` and ``CustomerID`` (empty, or a
float such as ``17850.0``: see "Customers") are used. ``Description``, ``UnitPrice`` and
``Country`` are not read, and ``CustomerID`` is never checked, so their oddities never stop a
file. The rules below were checked against the 20 files of
December 2010 (42,481 lines, 2,025 invoice numbers); the figures quoted are theirs.

Identity
    ``event_id`` and ``order_id`` are UUIDv5 of the invoice number under :data:`NAMESPACE`, with
    different names (:func:`event_id_for`, :func:`order_id_for`), so that publishing a file
    twice re-sends the same events and the service's inbox absorbs them (docs/cli.md). The
    ``OrderCancelled`` of a cancellation invoice and the ``OrderShipped``
    of an order take theirs from their own invoice number the same way
    (:func:`cancellation_event_id_for`, :func:`shipment_event_id_for`).

Time
    ``InvoiceDate`` is UK wall-clock time without a zone. It is read in ``Europe/London``
    (:mod:`zoneinfo`; slim images need the ``tzdata`` package) and carried with its UTC offset.
    Local times that a clock change makes ambiguous or nonexistent are read with ``fold=0``,
    the earlier of the two offsets: 01:30 on the October change day is the first 01:30 (BST,
    +01:00), and 01:30 on the March change day, which the clocks skip, is read with the offset
    in force before the change (GMT, +00:00). An invoice's ``placed_at`` is the earliest date of
    its lines: invoice 536591 has lines at 16:57 and at 16:58, and was placed when the shop
    started recording it.

Cancellations
    An ``InvoiceNo`` starting with ``C`` (326 invoices, 728 lines) cancels an earlier order; it
    is not an ``OrderPlaced``. It is read as a :class:`CancellationInvoice`, with its lines as
    recorded (negative quantities), and counted among what no ``OrderPlaced`` carries
    (:class:`SkipCounts`). It names no invoice: which order it cancels, if any can be told, is
    decided by ``fulfilment.dataset.retail_lifecycle``.

Customers
    ``CustomerID`` is kept as text, verbatim (``"17850.0"``), only to tell which orders a
    cancellation may cancel. An invoice has a customer when all its lines name the same
    non-empty one (every invoice of the data does, or has none on any line: 18 cancellations
    and 229 published orders have none); otherwise it has none, and the file is still read.

Non-positive lines
    A line with quantity <= 0 in a normal invoice (70 lines; stock adjustments such as
    "damaged" or "?") is something no shop front sends. It is skipped and counted. An invoice
    left with no line (all 70 of them, in this data) is skipped and counted as empty.

Invoices across files
    An invoice belongs to the file (the day) it is in. No invoice number of the data appears in
    two files, so one that does (the same file given twice, or overlapping exports) is an
    error naming both places: merging would double the lines of a file read twice, and keeping
    both would publish two different events under one ``event_id``. Inside one file, lines with
    the same number are one invoice even if not adjacent.

Repeated SKUs
    The same SKU on several lines of one invoice (242 invoices) stays on several lines: the
    event carries the lines as the shop recorded them, and the service sums them
    (``fulfilment.domain.model.aggregate_demand``).

Non-product codes
    ``POST``, ``DOT``, ``M``, ``D``, ``C2``, ``S``, ``BANK CHARGES``, ``AMAZONFEE`` and the like
    are published as lines like any other; whether they are stocked is the stock file's
    business. Codes are kept verbatim: case matters (``85123A`` and ``85123a`` are both in the
    data, as are ``M`` and ``m``).

Bad input
    A row with the wrong number of columns, an empty ``InvoiceNo``, a quantity that is not a
    plain integer or a date not in ``YYYY-MM-DD HH:MM:SS`` makes the whole read fail with
    :class:`OnlineRetailError` naming the file and line, for every row, cancelled or not: such
    a row means the file is not what it claims to be. A line that will be published must also
    fit the event contract: a SKU the contract's ``Sku`` takes (``sku_problem``: 1 to
    ``MAX_SKU_LENGTH`` characters, no leading or trailing white space, line feed or NUL; none
    of the data has any white space there, so stripping would be a guess), and at most
    ``MAX_QUANTITY`` units. An invoice with more lines than ``MAX_LINES`` is an
    error rather than split into several orders, which would reserve part of an order (the
    largest has 675 lines).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from uuid import UUID, uuid5
from zoneinfo import ZoneInfo

from fulfilment.contracts.order_placed import (
    MAX_LINES,
    MAX_QUANTITY,
    order_placed_body,
    shown_sku,
    sku_problem,
)
from fulfilment.utf8 import at_line, not_utf8

NAMESPACE = UUID("a6621eaf-b20e-51de-a8ee-d4d62a407d7a")
"""UUIDv5 namespace of every id minted from an invoice number.

It is ``uuid5(NAMESPACE_URL, "https://archive.ics.uci.edu/dataset/352/online+retail")``, the
data set's page, written out so that it can never change by accident: changing it changes
every ``event_id`` and ``order_id``, and a re-publish would then reserve every order again.
"""

HEADER = (
    "InvoiceNo",
    "StockCode",
    "Description",
    "Quantity",
    "InvoiceDate",
    "UnitPrice",
    "CustomerID",
    "Country",
)
"""The first row of every file, exactly."""

CANCELLATION_PREFIX = "C"
"""An ``InvoiceNo`` starting with this letter cancels an order (data set README)."""

UK_TIME_ZONE = "Europe/London"
"""The zone of ``InvoiceDate``: the shop is in the UK and writes local wall-clock time."""

DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
"""The format of ``InvoiceDate``; the pattern below keeps ``strptime`` from accepting more."""

_DATE = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}")
_INTEGER = re.compile(r"-?\d+")  # int() would also take "+6", " 6" and "6_000"
_INVOICE, _SKU, _QUANTITY, _DATE_COLUMN, _CUSTOMER = 0, 1, 3, 4, 6


class OnlineRetailError(ValueError):
    """A file cannot be read as Online Retail data.

    The message starts with the place, as ``"<file name>:<line>: <what is wrong>"``, e.g.
    ``"2010-12-01.csv:17: Quantity must be an integer, got 'x'"`` (line 1 is the header).
    """


def event_id_for(invoice_no: str) -> UUID:
    """The ``event_id`` of the ``OrderPlaced`` of invoice ``invoice_no`` (UUIDv5)."""
    return uuid5(NAMESPACE, f"OrderPlaced:{invoice_no}")


def order_id_for(invoice_no: str) -> UUID:
    """The ``order_id`` of invoice ``invoice_no`` (UUIDv5, a different name from the event's)."""
    return uuid5(NAMESPACE, f"order:{invoice_no}")


def cancellation_event_id_for(invoice_no: str) -> UUID:
    """The ``event_id`` of the ``OrderCancelled`` of cancellation invoice ``invoice_no``.

    UUIDv5 of the cancellation's own number (``"C536391"``), not of the order it cancels: two
    cancellations of one order are two events.
    """
    return uuid5(NAMESPACE, f"OrderCancelled:{invoice_no}")


def shipment_event_id_for(invoice_no: str) -> UUID:
    """The ``event_id`` of the ``OrderShipped`` of invoice ``invoice_no`` (UUIDv5).

    An order ships once (everything it still holds), so one id per order is enough.
    """
    return uuid5(NAMESPACE, f"OrderShipped:{invoice_no}")


@dataclass(frozen=True, slots=True)
class RetailOrder:
    """One invoice of the data, as one ``OrderPlaced`` v1 event.

    Attributes:
        invoice_no: the shop's invoice number, e.g. ``"536365"``.
        event_id: :func:`event_id_for` of the invoice number.
        order_id: :func:`order_id_for` of the invoice number.
        placed_at: the earliest ``InvoiceDate`` of the invoice, aware, in ``Europe/London``.
        lines: ``(sku, quantity)`` pairs in file order; quantity >= 1; a SKU may repeat.
        source: ``"<file name>:<line>"`` of the invoice's first line, for messages and logs.
        day: the name of its file without the suffix (``"2010-12-01"``): one file is one day.
        customer: its ``CustomerID`` as written (``"17850.0"``), or None (see "Customers").
    """

    invoice_no: str
    event_id: UUID
    order_id: UUID
    placed_at: datetime
    lines: tuple[tuple[str, int], ...]
    source: str
    day: str
    customer: str | None

    def body(self) -> bytes:
        """The UTF-8 JSON body that checkout would publish for this order.

        Raises:
            pydantic.ValidationError: never for an order made by :func:`read_orders`, which
                checks the contract's bounds first.
        """
        return order_placed_body(
            event_id=self.event_id,
            order_id=self.order_id,
            placed_at=self.placed_at,
            lines=list(self.lines),
        )


@dataclass(frozen=True, slots=True)
class CancellationInvoice:
    """One cancellation invoice of the data (a number starting with ``C``), as recorded.

    Attributes:
        invoice_no: its number, e.g. ``"C536391"``.
        cancelled_at: the earliest ``InvoiceDate`` of its lines, aware, in ``Europe/London``.
        lines: ``(sku, quantity)`` pairs in file order, quantities as recorded: negative in
            every cancellation of the data, but not checked here; a SKU may repeat.
        source: ``"<file name>:<line>"`` of its first line.
        day: the name of its file without the suffix.
        customer: its ``CustomerID`` as written, or None (see "Customers").
    """

    invoice_no: str
    cancelled_at: datetime
    lines: tuple[tuple[str, int], ...]
    source: str
    day: str
    customer: str | None


@dataclass(frozen=True, slots=True)
class SkipCounts:
    """What :func:`read_orders` left out, and why (see the module docstring).

    Attributes:
        cancelled_invoices: invoices whose number starts with ``C``.
        cancelled_lines: the lines of those invoices.
        non_positive_lines: lines of normal invoices with quantity <= 0.
        empty_invoices: normal invoices with no line left after those were dropped.
    """

    cancelled_invoices: int = 0
    cancelled_lines: int = 0
    non_positive_lines: int = 0
    empty_invoices: int = 0

    def describe(self) -> str:
        """One line for people, e.g. ``cancelled invoices 33, cancelled lines 62, ...``."""
        return ", ".join(
            f"{name.replace('_', ' ')} {getattr(self, name)}"
            for name in (
                "cancelled_invoices",
                "cancelled_lines",
                "non_positive_lines",
                "empty_invoices",
            )
        )


@dataclass(frozen=True, slots=True)
class ReadResult:
    """The orders read from some files, the cancellations, and what was skipped.

    Attributes:
        orders: one per published invoice, in file order, then order of first appearance.
        skipped: the counts of what no ``OrderPlaced`` carries (cancellations included).
        cancellations: every cancellation invoice, in the same order as ``orders``.
        days: the day (file name without the suffix) of each file read, in reading order.
    """

    orders: list[RetailOrder]
    skipped: SkipCounts
    cancellations: list[CancellationInvoice] = field(default_factory=list)
    days: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Invoice:
    """An invoice while its file is being read."""

    number: str
    source: str
    placed_at: datetime
    lines: list[tuple[str, int, str]] = field(default_factory=list)  # sku, quantity, place
    customers: set[str] = field(default_factory=set)

    @property
    def customer(self) -> str | None:
        """The one ``CustomerID`` all its lines name, or None (see "Customers")."""
        if len(self.customers) != 1:
            return None
        (customer,) = self.customers
        return customer or None


def csv_files(path: Path) -> list[Path]:
    """The CSV files named by ``path``: the file itself, or a folder's ``*.csv`` sorted by name.

    Only the folder itself is searched, not its sub-folders.

    Raises:
        OnlineRetailError: ``path`` does not exist, or is a folder without a ``*.csv`` file.
    """
    if path.is_dir():
        files = sorted((p for p in path.glob("*.csv") if p.is_file()), key=lambda p: p.name)
        if not files:
            msg = f"{path}: no *.csv file in this folder"
            raise OnlineRetailError(msg)
        return files
    if not path.exists():
        msg = f"{path}: no such file or folder"
        raise OnlineRetailError(msg)
    return [path]


def read_orders(paths: Sequence[Path]) -> ReadResult:
    """Read Online Retail CSV files into orders, one per published invoice.

    Args:
        paths: the files, read in this order (see :func:`csv_files` for a folder).

    Returns:
        The orders and the skip counts; the rules are in the module docstring.

    Raises:
        OnlineRetailError: a file cannot be read, or holds a bad row, an invoice number already
            read from another file, or an invoice that does not fit the event contract.
        zoneinfo.ZoneInfoNotFoundError: the system has no time zone data and ``tzdata`` is not
            installed.
    """
    zone = ZoneInfo(UK_TIME_ZONE)
    orders: list[RetailOrder] = []
    cancellations: list[CancellationInvoice] = []
    first_seen: dict[str, str] = {}
    cancelled_invoices = cancelled_lines = non_positive_lines = empty_invoices = 0
    for path in paths:
        for invoice in _read_invoices(path, zone):
            # A file yields each number once, so a number seen before came from another file.
            if invoice.number in first_seen:
                msg = (
                    f"{invoice.source}: invoice {invoice.number} was already read from"
                    f" {first_seen[invoice.number]}; an invoice belongs to one file"
                )
                raise OnlineRetailError(msg)
            first_seen[invoice.number] = invoice.source
            if invoice.number.startswith(CANCELLATION_PREFIX):
                cancelled_invoices += 1
                cancelled_lines += len(invoice.lines)
                cancellations.append(_cancellation(invoice, path.stem))
                continue
            kept = [line for line in invoice.lines if line[1] > 0]
            non_positive_lines += len(invoice.lines) - len(kept)
            if not kept:
                empty_invoices += 1
                continue
            orders.append(_order(invoice, kept, path.stem))
    skipped = SkipCounts(
        cancelled_invoices=cancelled_invoices,
        cancelled_lines=cancelled_lines,
        non_positive_lines=non_positive_lines,
        empty_invoices=empty_invoices,
    )
    return ReadResult(
        orders=orders,
        skipped=skipped,
        cancellations=cancellations,
        days=[path.stem for path in paths],
    )


def _cancellation(invoice: _Invoice, day: str) -> CancellationInvoice:
    return CancellationInvoice(
        invoice_no=invoice.number,
        cancelled_at=invoice.placed_at,
        lines=tuple((sku, quantity) for sku, quantity, _ in invoice.lines),
        source=invoice.source,
        day=day,
        customer=invoice.customer,
    )


def _order(invoice: _Invoice, lines: list[tuple[str, int, str]], day: str) -> RetailOrder:
    """Check the lines that will be published against the event contract, and build the order."""
    if len(lines) > MAX_LINES:
        msg = (
            f"{invoice.source}: invoice {invoice.number} has {len(lines)} lines; an OrderPlaced"
            f" carries at most {MAX_LINES} and an order is never split"
        )
        raise OnlineRetailError(msg)
    for sku, quantity, place in lines:
        if (problem := sku_problem(sku)) is not None:
            msg = f"{place}: StockCode {problem}, got {shown_sku(sku)}"
            raise OnlineRetailError(msg)
        if quantity > MAX_QUANTITY:
            msg = f"{place}: Quantity must be at most {MAX_QUANTITY}, got {quantity}"
            raise OnlineRetailError(msg)
    return RetailOrder(
        invoice_no=invoice.number,
        event_id=event_id_for(invoice.number),
        order_id=order_id_for(invoice.number),
        placed_at=invoice.placed_at,
        lines=tuple((sku, quantity) for sku, quantity, _ in lines),
        source=invoice.source,
        day=day,
        customer=invoice.customer,
    )


def _read_invoices(path: Path, zone: ZoneInfo) -> list[_Invoice]:
    """Every invoice of one file, in order of first appearance, with all its lines."""
    invoices: dict[str, _Invoice] = {}
    for place, row in _rows(path):
        number = row[_INVOICE]
        if not number:
            msg = f"{place}: InvoiceNo is empty"
            raise OnlineRetailError(msg)
        quantity = _quantity(row[_QUANTITY], place)
        placed_at = _local_time(row[_DATE_COLUMN], place, zone)
        invoice = invoices.get(number)
        if invoice is None:
            invoice = invoices[number] = _Invoice(number, place, placed_at)
        invoice.placed_at = min(invoice.placed_at, placed_at)
        invoice.lines.append((row[_SKU], quantity, place))
        invoice.customers.add(row[_CUSTOMER])
    return list(invoices.values())


def _rows(path: Path) -> Iterator[tuple[str, list[str]]]:
    """Yield ``(place, row)`` for each data row of ``path``, after checking the header.

    ``place`` is ``"<file name>:<line>"``, the physical line where the row ends (a quoted
    field may span lines). A leading UTF-8 byte-order mark is tolerated.
    """
    name = path.name
    line = 0
    try:
        with path.open(encoding="utf-8-sig", newline="") as stream:
            reader = csv.reader(stream, strict=True)
            header = next(reader, None)
            line = reader.line_num
            if header is None:
                msg = f"{name}:1: the file is empty; expected the header {','.join(HEADER)}"
                raise OnlineRetailError(msg)
            if tuple(header) != HEADER:
                msg = f"{name}:1: expected the header {','.join(HEADER)}, got {','.join(header)}"
                raise OnlineRetailError(msg)
            for row in reader:
                line = reader.line_num
                if len(row) != len(HEADER):
                    msg = f"{name}:{line}: expected {len(HEADER)} columns, got {len(row)}"
                    raise OnlineRetailError(msg)
                yield f"{name}:{line}", row
    except csv.Error as error:
        msg = f"{name}:{line + 1}: not valid CSV: {error}"
        raise OnlineRetailError(msg) from error
    except UnicodeDecodeError as error:
        # The stream decodes ahead of the reader, in chunks: neither the reader's line nor the
        # error's offset (counted from the chunk) is the bad byte's.
        bad_line, problem = not_utf8(path, error)
        raise OnlineRetailError(at_line(name, bad_line, problem)) from error
    except OSError as error:
        msg = f"{path}: cannot read: {error.strerror or error}"
        raise OnlineRetailError(msg) from error


def _quantity(text: str, place: str) -> int:
    if not _INTEGER.fullmatch(text):
        msg = f"{place}: Quantity must be an integer, got {text!r}"
        raise OnlineRetailError(msg)
    return int(text)


def _local_time(text: str, place: str, zone: ZoneInfo) -> datetime:
    if not _DATE.fullmatch(text):
        msg = f"{place}: InvoiceDate must be YYYY-MM-DD HH:MM:SS, got {text!r}"
        raise OnlineRetailError(msg)
    try:
        naive = datetime.strptime(text, DATE_FORMAT)  # noqa: DTZ007 - the zone is attached below
    except ValueError as error:
        msg = f"{place}: InvoiceDate is not a valid date: {text!r}"
        raise OnlineRetailError(msg) from error
    # fold=0 (the default, stated so it cannot drift): the earlier offset at a clock change.
    return naive.replace(tzinfo=zone, fold=0)
