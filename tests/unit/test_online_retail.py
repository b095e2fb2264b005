from __future__ import annotations

import csv
import os
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from uuid import NAMESPACE_URL, uuid5
from zoneinfo import ZoneInfo

import pytest

from fulfilment.contracts.order_placed import MAX_LINES, OrderPlacedV1
from fulfilment.dataset.online_retail import (
    NAMESPACE,
    CancellationInvoice,
    OnlineRetailError,
    SkipCounts,
    cancellation_event_id_for,
    csv_files,
    event_id_for,
    order_id_for,
    read_orders,
    shipment_event_id_for,
)

HEADER = "InvoiceNo,StockCode,Description,Quantity,InvoiceDate,UnitPrice,CustomerID,Country\n"

# Real lines of 2010-12-01 and 2010-12-02, with their oddities: doubled quotes and commas in
# descriptions, empty CustomerID, a cancellation, a negative line alone in its invoice, a
# bank charge, a lower-case SKU, the same SKU twice in one invoice, and an invoice whose lines
# carry two different minutes.
DAY_ONE = HEADER + (
    "536365,85123A,WHITE HANGING HEART T-LIGHT HOLDER,6,2010-12-01 08:26:00,2.55,17850.0,"
    "United Kingdom\n"
    "536365,71053,WHITE METAL LANTERN,6,2010-12-01 08:26:00,3.39,17850.0,United Kingdom\n"
    "C536379,D,Discount,-1,2010-12-01 09:41:00,27.5,14527.0,United Kingdom\n"
    '536540,85071C,"CHARLIE+LOLA""EXTREMELY BUSY"" SIGN",6,2010-12-01 14:05:00,2.55,14911.0,'
    "EIRE\n"
    '536544,90214D,"LETTER ""D"" BLING KEY RING",1,2010-12-01 14:32:00,0.85,,United Kingdom\n'
    '536544,90214D,"LETTER ""D"" BLING KEY RING",2,2010-12-01 14:32:00,0.85,,United Kingdom\n'
    '536591,51014C,"FEATHER PEN,COAL BLACK",12,2010-12-01 16:58:00,0.85,14606.0,United Kingdom\n'
    "536591,21398,RED POLKADOT COFFEE  MUG,1,2010-12-01 16:57:00,2.1,14606.0,United Kingdom\n"
)
DAY_TWO = HEADER + (
    "536764,84952C,,-38,2010-12-02 14:42:00,0.0,,United Kingdom\n"
    "536779,BANK CHARGES,Bank Charges,1,2010-12-02 15:08:00,15.0,15823.0,United Kingdom\n"
    "536862,15056bl,EDWARDIAN PARASOL BLACK,1,2010-12-03 11:13:00,12.72,,United Kingdom\n"
    "536862,POST,POSTAGE,1,2010-12-03 11:13:00,18.0,,United Kingdom\n"
    "536862,22041,RECORD FRAME,0,2010-12-03 11:13:00,2.1,,United Kingdom\n"
    "C537572,BANK CHARGES,Bank Charges,-1,2010-12-07 12:00:00,95.38,,United Kingdom\n"
    "C537572,POST,POSTAGE,-2,2010-12-07 12:00:00,18.0,,United Kingdom\n"
)
LONDON = ZoneInfo("Europe/London")
# The whole data set is not shipped; point FULFILMENT_TEST_ONLINE_RETAIL_DIR at its folder of
# per-day files to check the counts over all of it.
REAL_DATA = Path(os.environ.get("FULFILMENT_TEST_ONLINE_RETAIL_DIR", "/nonexistent"))


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def one_line(tmp_path: Path, row: str) -> Path:
    return write(tmp_path, "2010-12-01.csv", HEADER + row + "\n")


def test_each_invoice_becomes_one_order_with_its_lines_as_recorded(tmp_path):
    result = read_orders([write(tmp_path, "2010-12-01.csv", DAY_ONE)])

    assert [(o.invoice_no, o.lines) for o in result.orders] == [
        ("536365", (("85123A", 6), ("71053", 6))),
        ("536540", (("85071C", 6),)),
        ("536544", (("90214D", 1), ("90214D", 2))),
        ("536591", (("51014C", 12), ("21398", 1))),
    ]
    assert [o.source for o in result.orders] == [
        "2010-12-01.csv:2",
        "2010-12-01.csv:5",
        "2010-12-01.csv:6",
        "2010-12-01.csv:8",
    ]


def test_cancellations_non_positive_lines_and_emptied_invoices_are_skipped_and_counted(
    tmp_path,
):
    result = read_orders([write(tmp_path, "2010-12-02.csv", DAY_TWO)])

    assert [(o.invoice_no, o.lines) for o in result.orders] == [
        ("536779", (("BANK CHARGES", 1),)),
        ("536862", (("15056bl", 1), ("POST", 1))),
    ]
    assert result.skipped == SkipCounts(
        cancelled_invoices=1, cancelled_lines=2, non_positive_lines=2, empty_invoices=1
    )


def test_cancellations_are_read_as_recorded_with_their_customer_time_and_day(tmp_path):
    day_one = write(tmp_path, "2010-12-01.csv", DAY_ONE)
    day_two = write(tmp_path, "2010-12-02.csv", DAY_TWO)

    result = read_orders([day_one, day_two])

    assert result.cancellations == [
        CancellationInvoice(
            invoice_no="C536379",
            cancelled_at=datetime(2010, 12, 1, 9, 41, tzinfo=LONDON),
            lines=(("D", -1),),
            source="2010-12-01.csv:4",
            day="2010-12-01",
            customer="14527.0",
        ),
        CancellationInvoice(
            invoice_no="C537572",
            cancelled_at=datetime(2010, 12, 7, 12, 0, tzinfo=LONDON),
            lines=(("BANK CHARGES", -1), ("POST", -2)),
            source="2010-12-02.csv:7",
            day="2010-12-02",
            customer=None,
        ),
    ]
    assert result.days == ["2010-12-01", "2010-12-02"]


def test_an_order_has_the_customer_all_its_lines_name_verbatim_or_none(tmp_path):
    text = HEADER + (
        "1,A,x,1,2010-12-01 08:00:00,1,17850.0,UK\n"
        "1,B,x,1,2010-12-01 08:00:00,1,17850.0,UK\n"
        "2,A,x,1,2010-12-01 08:01:00,1,,UK\n"
        "3,A,x,1,2010-12-01 08:02:00,1,17850.0,UK\n"
        "3,B,x,1,2010-12-01 08:02:00,1,12345.0,UK\n"
        "4,A,x,1,2010-12-01 08:03:00,1,17850.0,UK\n"
        "4,B,x,1,2010-12-01 08:03:00,1,,UK\n"
    )

    orders = read_orders([write(tmp_path, "2010-12-01.csv", text)]).orders

    assert [(o.invoice_no, o.customer, o.day) for o in orders] == [
        ("1", "17850.0", "2010-12-01"),
        ("2", None, "2010-12-01"),
        ("3", None, "2010-12-01"),  # two customers: none is the order's
        ("4", None, "2010-12-01"),
    ]


def test_orders_come_in_file_order_then_first_appearance(tmp_path):
    day_one = write(tmp_path, "2010-12-01.csv", DAY_ONE)
    day_two = write(tmp_path, "2010-12-02.csv", DAY_TWO)

    result = read_orders([day_two, day_one])

    assert [o.invoice_no for o in result.orders] == [
        "536779",
        "536862",
        "536365",
        "536540",
        "536544",
        "536591",
    ]
    assert result.skipped == SkipCounts(
        cancelled_invoices=2, cancelled_lines=3, non_positive_lines=2, empty_invoices=1
    )


def test_placed_at_is_the_earliest_uk_time_of_the_invoice_with_its_offset(tmp_path):
    orders = read_orders([write(tmp_path, "2010-12-01.csv", DAY_ONE)]).orders
    by_number = {o.invoice_no: o for o in orders}

    first = by_number["536365"].placed_at
    assert first == datetime(2010, 12, 1, 8, 26, tzinfo=LONDON)
    assert first.utcoffset() == timedelta(0)
    assert by_number["536591"].placed_at == datetime(2010, 12, 1, 16, 57, tzinfo=LONDON)


def test_summer_time_is_carried_as_an_offset_of_one_hour(tmp_path):
    path = one_line(tmp_path, "1,22041,FRAME,1,2011-06-01 09:00:00,2.1,,United Kingdom")

    (order,) = read_orders([path]).orders

    assert order.placed_at.utcoffset() == timedelta(hours=1)
    event = OrderPlacedV1.model_validate_json(order.body())
    assert event.placed_at.isoformat() == "2011-06-01T09:00:00+01:00"


@pytest.mark.parametrize(
    ("local", "offset"),
    [
        # 2011-10-30: 01:30 happens twice; fold=0 takes the first, still summer time.
        ("2011-10-30 01:30:00", timedelta(hours=1)),
        # 2011-03-27: clocks jump from 01:00 to 02:00; the offset before the change is used.
        ("2011-03-27 01:30:00", timedelta(0)),
    ],
)
def test_times_made_ambiguous_or_skipped_by_a_clock_change_take_the_earlier_offset(
    tmp_path, local, offset
):
    path = one_line(tmp_path, f"1,22041,FRAME,1,{local},2.1,,United Kingdom")

    (order,) = read_orders([path]).orders

    assert order.placed_at.utcoffset() == offset
    assert order.placed_at.fold == 0


def test_every_body_is_a_valid_order_placed_v1_event(tmp_path):
    day_one = write(tmp_path, "2010-12-01.csv", DAY_ONE)
    day_two = write(tmp_path, "2010-12-02.csv", DAY_TWO)

    for order in read_orders([day_one, day_two]).orders:
        event = OrderPlacedV1.model_validate_json(order.body())
        assert event.event_id == order.event_id
        assert event.order_id == order.order_id
        assert event.placed_at == order.placed_at
        assert [(line.sku, line.quantity) for line in event.lines] == list(order.lines)


def test_reading_a_file_twice_gives_the_same_ids(tmp_path):
    path = write(tmp_path, "2010-12-01.csv", DAY_ONE)

    first = read_orders([path]).orders
    again = read_orders([path]).orders

    assert [(o.event_id, o.order_id) for o in first] == [(o.event_id, o.order_id) for o in again]
    assert [o.body() for o in first] == [o.body() for o in again]


def test_ids_are_uuid5_of_the_invoice_number_under_the_documented_namespace():
    assert uuid5(NAMESPACE_URL, "https://archive.ics.uci.edu/dataset/352/online+retail") == (
        NAMESPACE
    )
    assert event_id_for("536365") == uuid5(NAMESPACE, "OrderPlaced:536365")
    assert order_id_for("536365") == uuid5(NAMESPACE, "order:536365")
    # Pinned: a change here changes every id, and a re-publish would reserve again.
    assert str(event_id_for("536365")) == "c7f5f8ee-4ff3-5e4e-9f74-73b60a9c0c18"
    assert str(order_id_for("536365")) == "ce90d55a-d608-53df-bf99-612851033ceb"


def test_event_and_order_ids_differ_and_belong_to_one_invoice_each():
    numbers = ["536365", "536366", "C536379", "536365A"]
    ids = [event_id_for(n) for n in numbers] + [order_id_for(n) for n in numbers]
    ids += [cancellation_event_id_for(n) for n in numbers]
    ids += [shipment_event_id_for(n) for n in numbers]

    assert len(set(ids)) == len(ids)


def test_cancellation_and_shipment_ids_are_uuid5_of_their_own_invoice_number():
    assert cancellation_event_id_for("C536391") == uuid5(NAMESPACE, "OrderCancelled:C536391")
    assert shipment_event_id_for("536365") == uuid5(NAMESPACE, "OrderShipped:536365")
    # Pinned like the OrderPlaced ids: a change would make a re-run apply them again.
    assert str(cancellation_event_id_for("C536391")) == "7643806c-ec2d-5f93-8c8a-fb1cfdd9309c"
    assert str(shipment_event_id_for("536365")) == "62f99ba7-8992-5b59-bc0e-ea6569a97beb"


def test_an_invoice_number_in_two_files_is_an_error_naming_both(tmp_path):
    day_one = write(tmp_path, "2010-12-01.csv", DAY_ONE)
    copy = write(tmp_path, "copy.csv", DAY_ONE)

    with pytest.raises(OnlineRetailError) as error:
        read_orders([day_one, copy])

    assert str(error.value) == (
        "copy.csv:2: invoice 536365 was already read from 2010-12-01.csv:2;"
        " an invoice belongs to one file"
    )


def test_the_same_file_given_twice_is_refused_rather_than_doubled(tmp_path):
    path = write(tmp_path, "2010-12-01.csv", DAY_ONE)

    with pytest.raises(OnlineRetailError, match="already read"):
        read_orders([path, path])


def test_lines_of_one_invoice_need_not_be_adjacent(tmp_path):
    text = HEADER + (
        "1,A,x,1,2010-12-01 08:00:00,1,,UK\n"
        "2,B,x,1,2010-12-01 08:01:00,1,,UK\n"
        "1,C,x,2,2010-12-01 08:00:00,1,,UK\n"
    )

    orders = read_orders([write(tmp_path, "2010-12-01.csv", text)]).orders

    assert [(o.invoice_no, o.lines) for o in orders] == [
        ("1", (("A", 1), ("C", 2))),
        ("2", (("B", 1),)),
    ]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            "536365,85123A,HOLDER,x,2010-12-01 08:26:00,2.55,,UK",
            "2010-12-01.csv:3: Quantity must be an integer, got 'x'",
        ),
        (
            "536365,85123A,HOLDER,6.0,2010-12-01 08:26:00,2.55,,UK",
            "2010-12-01.csv:3: Quantity must be an integer, got '6.0'",
        ),
        (
            "536365,85123A,HOLDER,6,2010-12-01 08:26:00,2.55,UK",
            "2010-12-01.csv:3: expected 8 columns, got 7",
        ),
        (
            '536365,85123A,"HOLDER, WHITE",6,2010-12-01 08:26:00,2.55,,UK,extra',
            "2010-12-01.csv:3: expected 8 columns, got 9",
        ),
        (
            "536365,85123A,HOLDER,6,01/12/2010 08:26,2.55,,UK",
            "2010-12-01.csv:3: InvoiceDate must be YYYY-MM-DD HH:MM:SS, got '01/12/2010 08:26'",
        ),
        (
            "536365,85123A,HOLDER,6,2010-02-30 08:26:00,2.55,,UK",
            "2010-12-01.csv:3: InvoiceDate is not a valid date: '2010-02-30 08:26:00'",
        ),
        (
            ",85123A,HOLDER,6,2010-12-01 08:26:00,2.55,,UK",
            "2010-12-01.csv:3: InvoiceNo is empty",
        ),
        (
            "536365, 85123A,HOLDER,6,2010-12-01 08:26:00,2.55,,UK",
            (
                "2010-12-01.csv:3: StockCode must not start or end with white space, nor contain"
                " a line feed, got ' 85123A'"
            ),
        ),
        (
            "536365,,HOLDER,6,2010-12-01 08:26:00,2.55,,UK",
            "2010-12-01.csv:3: StockCode is empty, got ''",
        ),
        (
            "536365,85\x0023A,HOLDER,6,2010-12-01 08:26:00,2.55,,UK",
            (
                "2010-12-01.csv:3: StockCode must not contain NUL (U+0000): PostgreSQL text"
                " cannot store it, got '85\\x0023A'"
            ),
        ),
        (
            "536365,85123A,HOLDER,1000001,2010-12-01 08:26:00,2.55,,UK",
            "2010-12-01.csv:3: Quantity must be at most 1000000, got 1000001",
        ),
    ],
)
def test_a_bad_row_is_an_error_naming_file_and_line(tmp_path, row, message):
    good = "536364,71053,LANTERN,6,2010-12-01 08:25:00,3.39,,UK\n"
    path = write(tmp_path, "2010-12-01.csv", HEADER + good + row + "\n")

    with pytest.raises(OnlineRetailError) as error:
        read_orders([path])

    assert str(error.value) == message


def test_a_bad_row_in_a_cancellation_is_an_error_too(tmp_path):
    path = one_line(tmp_path, "C536379,D,Discount,-x,2010-12-01 09:41:00,27.5,,UK")

    with pytest.raises(OnlineRetailError, match=r"^2010-12-01\.csv:2: Quantity"):
        read_orders([path])


def test_line_numbers_count_physical_lines_of_quoted_fields(tmp_path):
    text = HEADER + (
        '1,A,"TWO\nLINES",1,2010-12-01 08:00:00,1,,UK\n1,B,x,y,2010-12-01 08:00:00,1,,UK\n'
    )

    with pytest.raises(OnlineRetailError, match=r"^2010-12-01\.csv:4: Quantity"):
        read_orders([write(tmp_path, "2010-12-01.csv", text)])


def test_a_wrong_header_is_an_error_on_line_one(tmp_path):
    path = write(tmp_path, "stock.csv", "sku,on_hand\n85123A,6\n")

    with pytest.raises(OnlineRetailError, match=r"^stock\.csv:1: expected the header InvoiceNo,"):
        read_orders([path])


def test_an_empty_file_is_an_error(tmp_path):
    with pytest.raises(OnlineRetailError, match=r"^empty\.csv:1: the file is empty"):
        read_orders([write(tmp_path, "empty.csv", "")])


GOOD_ROW = b"1,A,CAFE,1,2010-12-01 08:00:00,1,,UK\n"
NOT_UTF8_ROW = b"2,A,CAF\xe9,1,2010-12-01 08:00:00,1,,UK\n"


@pytest.mark.parametrize(
    ("start", "line"),
    [
        (HEADER.encode() + GOOD_ROW, 3),
        # A byte-order mark, and a bad byte beyond the text stream's first chunk of 8 KiB.
        (b"\xef\xbb\xbf" + HEADER.encode() + GOOD_ROW * 2999, 3001),
    ],
    ids=["line 3", "past the first chunk"],
)
def test_a_file_that_is_not_utf8_is_an_error_naming_the_line_and_byte_of_the_bad_byte(
    tmp_path, start, line
):
    path = tmp_path / "2010-12-01.csv"
    path.write_bytes(start + NOT_UTF8_ROW + GOOD_ROW)
    column = NOT_UTF8_ROW.index(b"\xe9") + 1

    with pytest.raises(OnlineRetailError) as raised:
        read_orders([path])

    assert str(raised.value) == (
        f"2010-12-01.csv:{line}: not UTF-8 (invalid continuation byte at byte {column} of the line)"
    )


def test_a_byte_order_mark_is_tolerated(tmp_path):
    path = tmp_path / "2010-12-01.csv"
    path.write_bytes(b"\xef\xbb\xbf" + DAY_ONE.encode())

    assert len(read_orders([path]).orders) == 4


def test_an_invoice_longer_than_the_contract_allows_is_an_error_not_split(tmp_path):
    rows = "".join(f"1,SKU{n},x,1,2010-12-01 08:00:00,1,,UK\n" for n in range(MAX_LINES + 1))
    path = write(tmp_path, "2010-12-01.csv", HEADER + rows)

    with pytest.raises(OnlineRetailError) as error:
        read_orders([path])

    assert str(error.value) == (
        f"2010-12-01.csv:2: invoice 1 has {MAX_LINES + 1} lines; an OrderPlaced carries at"
        f" most {MAX_LINES} and an order is never split"
    )


def test_an_invoice_of_exactly_max_lines_is_one_order(tmp_path):
    rows = "".join(f"1,SKU{n},x,1,2010-12-01 08:00:00,1,,UK\n" for n in range(MAX_LINES))
    path = write(tmp_path, "2010-12-01.csv", HEADER + rows)

    (order,) = read_orders([path]).orders

    assert len(OrderPlacedV1.model_validate_json(order.body()).lines) == MAX_LINES


def test_a_missing_file_is_an_online_retail_error(tmp_path):
    with pytest.raises(OnlineRetailError, match="cannot read"):
        read_orders([tmp_path / "missing.csv"])


def test_csv_files_of_a_folder_are_its_csv_files_sorted_by_name(tmp_path):
    for name in ["2010-12-02.csv", "2010-12-01.csv", "notes.txt"]:
        write(tmp_path, name, HEADER)
    (tmp_path / "nested").mkdir()
    write(tmp_path / "nested", "2010-12-03.csv", HEADER)

    assert [p.name for p in csv_files(tmp_path)] == ["2010-12-01.csv", "2010-12-02.csv"]


def test_csv_files_of_a_file_is_that_file(tmp_path):
    path = write(tmp_path, "day.csv", HEADER)

    assert csv_files(path) == [path]


def test_csv_files_of_a_folder_without_csv_is_an_error_naming_it(tmp_path):
    write(tmp_path, "notes.txt", "")

    with pytest.raises(OnlineRetailError) as error:
        csv_files(tmp_path)

    assert str(error.value) == f"{tmp_path}: no *.csv file in this folder"


def test_csv_files_of_a_missing_path_is_an_error(tmp_path):
    with pytest.raises(OnlineRetailError, match="no such file or folder"):
        csv_files(tmp_path / "missing")


def independent_counts(files: list[Path]) -> dict[str, int]:
    """The figures of the module docstring, by a plain pass over the rows."""
    lines_of: dict[str, list[tuple[str, int]]] = {}
    for path in files:
        with path.open(newline="", encoding="utf-8") as stream:
            for row in csv.DictReader(stream):
                lines_of.setdefault(row["InvoiceNo"], []).append(
                    (row["StockCode"], int(row["Quantity"]))
                )
    cancelled = {n: ls for n, ls in lines_of.items() if n.startswith("C")}
    normal = {n: ls for n, ls in lines_of.items() if not n.startswith("C")}
    kept = {n: [(s, q) for s, q in ls if q > 0] for n, ls in normal.items()}
    published = {n: ls for n, ls in kept.items() if ls}
    return {
        "published": len(published),
        "published_lines": sum(map(len, published.values())),
        "skus": len({s for ls in published.values() for s, _ in ls}),
        "repeated_sku_orders": sum(
            1 for ls in published.values() if max(Counter(s for s, _ in ls).values()) > 1
        ),
        "cancelled_invoices": len(cancelled),
        "cancelled_lines": sum(map(len, cancelled.values())),
        "non_positive_lines": sum(len(ls) - len(kept[n]) for n, ls in normal.items()),
        "empty_invoices": len(kept) - len(published),
        "largest_order": max(map(len, published.values())),
    }


@pytest.mark.skipif(
    not REAL_DATA.is_dir(), reason="FULFILMENT_TEST_ONLINE_RETAIL_DIR names no folder"
)
def test_all_real_files_of_december_2010_are_read_with_the_documented_counts():
    files = csv_files(REAL_DATA)
    result = read_orders(files)

    found = {
        "published": len(result.orders),
        "published_lines": sum(len(o.lines) for o in result.orders),
        "skus": len({sku for o in result.orders for sku, _ in o.lines}),
        "repeated_sku_orders": sum(
            1 for o in result.orders if len({s for s, _ in o.lines}) < len(o.lines)
        ),
        "cancelled_invoices": result.skipped.cancelled_invoices,
        "cancelled_lines": result.skipped.cancelled_lines,
        "non_positive_lines": result.skipped.non_positive_lines,
        "empty_invoices": result.skipped.empty_invoices,
        "largest_order": max(len(o.lines) for o in result.orders),
    }
    assert found == independent_counts(files)
    assert found == {
        "published": 1629,
        "published_lines": 41683,
        "skus": 2805,
        "repeated_sku_orders": 242,
        "cancelled_invoices": 326,
        "cancelled_lines": 728,
        "non_positive_lines": 70,
        "empty_invoices": 70,
        "largest_order": 675,
    }
    assert len(files) == 20
    for order in result.orders:
        OrderPlacedV1.model_validate_json(order.body())
