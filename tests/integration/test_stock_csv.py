from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from builders import order
from fulfilment.domain.model import OutcomeKind, StockLevel
from fulfilment.entrypoints.startup import database_options
from fulfilment.exit_codes import ExitCode
from fulfilment.settings import Settings
from fulfilment.tools.command import CommandError, ToolOptions
from fulfilment.tools.stock_csv import MAX_ON_HAND, StockCsvError, load_command, read_stock_csv

SAMPLE = Path(__file__).parents[2] / "data" / "sample" / "stock.csv"


def write(tmp_path, text, name="stock.csv", encoding="utf-8"):
    path = tmp_path / name
    path.write_bytes(text.encode(encoding))
    return path


def error_of(path):
    with pytest.raises(StockCsvError) as raised:
        read_stock_csv(path)
    return raised.value


def test_a_stock_file_is_read_into_levels_per_sku(tmp_path):
    path = write(tmp_path, "sku,on_hand\n85123A,12\n15056bl,0\n15056BL,3\nBANK CHARGES,1\n")

    assert read_stock_csv(path) == {"85123A": 12, "15056bl": 0, "15056BL": 3, "BANK CHARGES": 1}


def test_a_byte_order_mark_and_windows_line_ends_are_tolerated(tmp_path):
    path = write(tmp_path, "\ufeffsku,on_hand\r\ngift_0001_40,7\r\n")

    assert read_stock_csv(path) == {"gift_0001_40": 7}


def test_a_quoted_sku_may_hold_a_comma(tmp_path):
    path = write(tmp_path, 'sku,on_hand\n"A,B",1\n')

    assert read_stock_csv(path) == {"A,B": 1}


def test_blank_lines_are_skipped_and_lines_keep_their_numbers(tmp_path):
    path = write(tmp_path, "sku,on_hand\n\nA,1\n\nB,-3\n")

    assert str(error_of(path)) == f"{path}:5: on_hand must be a whole number >= 0, got '-3'"


def test_an_error_names_the_file_and_the_line(tmp_path):
    rows = "".join(f"SKU{i},{i}\n" for i in range(15))
    path = write(tmp_path, "sku,on_hand\n" + rows + "BAD,-3\n")

    error = error_of(path)

    assert str(error) == f"{path}:17: on_hand must be a whole number >= 0, got '-3'"
    assert (error.path, error.line) == (path, 17)


@pytest.mark.parametrize("on_hand", ["1.5", "", "ten", " 3", "3 ", "+3", "1e3", "٣"])
def test_on_hand_must_be_a_whole_number(tmp_path, on_hand):
    path = write(tmp_path, f"sku,on_hand\nA,{on_hand}\n")

    assert str(error_of(path)) == f"{path}:2: on_hand must be a whole number >= 0, got {on_hand!r}"


def test_on_hand_must_fit_the_database(tmp_path):
    ok = write(tmp_path, f"sku,on_hand\nA,{MAX_ON_HAND}\nB,000000000000000001\n", "ok.csv")
    too_big = write(tmp_path, f"sku,on_hand\nA,{MAX_ON_HAND + 1}\n", "big.csv")
    huge = write(tmp_path, "sku,on_hand\nA," + "9" * 5000 + "\n", "huge.csv")

    assert read_stock_csv(ok) == {"A": MAX_ON_HAND, "B": 1}
    assert "big.csv:2: on_hand must be at most 2147483647" in str(error_of(too_big))
    assert "huge.csv:2: on_hand must be at most" in str(error_of(huge))


def test_a_duplicate_sku_names_both_lines(tmp_path):
    path = write(tmp_path, "sku,on_hand\nA,1\nB,2\nA,3\n")

    assert str(error_of(path)) == f"{path}:4: duplicate SKU 'A' (first on line 2)"


def test_skus_differing_only_in_case_are_not_duplicates(tmp_path):
    path = write(tmp_path, "sku,on_hand\n15056bl,1\n15056BL,2\n")

    assert read_stock_csv(path) == {"15056bl": 1, "15056BL": 2}


@pytest.mark.parametrize("sku", [" A", "A ", "\tA", '" A"'])
def test_spaces_around_a_sku_are_an_error(tmp_path, sku):
    path = write(tmp_path, f"sku,on_hand\n{sku},1\n")

    assert "stock.csv:2: sku must not start or end with white space" in str(error_of(path))


def test_a_sku_with_a_nul_is_an_error_naming_its_line(tmp_path):
    # PostgreSQL's text cannot hold U+0000: loaded, the upsert failed with a traceback.
    path = write(tmp_path, "sku,on_hand\nB,1\nA\x001,5\n")

    assert str(error_of(path)) == (
        f"{path}:3: sku must not contain NUL (U+0000): PostgreSQL text cannot store it,"
        " got 'A\\x001'"
    )


def test_an_empty_sku_is_an_error(tmp_path):
    path = write(tmp_path, "sku,on_hand\n,1\n")

    assert str(error_of(path)) == f"{path}:2: sku is empty, got ''"


def test_a_sku_longer_than_the_event_contract_allows_is_an_error(tmp_path):
    path = write(tmp_path, "sku,on_hand\n" + "X" * 65 + ",1\n")

    # The SKU is quoted up to the longest a SKU may be, not whole.
    assert str(error_of(path)).endswith(
        ":2: sku is longer than 64 characters, got '" + "X" * 64 + "'... (65 characters)"
    )


def test_a_sku_no_event_could_name_is_not_loaded(tmp_path):
    # A quoted field may hold a line feed; the event contract refuses such a SKU, so no order
    # could ever reserve it.
    path = write(tmp_path, 'sku,on_hand\n"A\nB",1\n')

    # The row is named by the line it starts on.
    assert str(error_of(path)) == (
        f"{path}:2: sku must not start or end with white space, nor contain a line feed,"
        " got 'A\\nB'"
    )


@pytest.mark.parametrize("row", ["A", "A,1,2", "A,1,"])
def test_a_row_must_have_two_fields(tmp_path, row):
    path = write(tmp_path, f"sku,on_hand\n{row}\n")

    assert "stock.csv:2: expected 2 fields (sku,on_hand)" in str(error_of(path))


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("SKU,on_hand\nA,1\n", "'SKU,on_hand'"),
        ("sku,on_hand,location\n", "'sku,on_hand,location'"),
        ("on_hand,sku\n", "'on_hand,sku'"),
        ("sku, on_hand\n", "'sku, on_hand'"),
        ("A,1\n", "'A,1'"),
        ("", "an empty file"),
    ],
)
def test_the_header_must_be_exactly_sku_on_hand(tmp_path, text, shown):
    path = write(tmp_path, text)

    assert str(error_of(path)) == f"{path}:1: header must be exactly 'sku,on_hand', got {shown}"


@pytest.mark.parametrize(
    ("start", "line"),
    [
        (b"sku,on_hand\nA,1\n", 3),
        # A byte-order mark, and a bad byte beyond the text stream's first chunk of 8 KiB.
        (b"\xef\xbb\xbfsku,on_hand\n" + b"".join(b"S%d,1\n" % i for i in range(2, 3000)), 3000),
    ],
    ids=["line 3", "past the first chunk"],
)
def test_a_file_that_is_not_utf8_is_an_error_naming_the_line_of_the_bad_byte(tmp_path, start, line):
    path = tmp_path / "binary.csv"
    path.write_bytes(start + "CAFÉ,2\nB,1\n".encode("latin-1"))

    # É is the line's fourth byte in Latin-1.
    assert str(error_of(path)) == (
        f"{path}:{line}: not UTF-8 (invalid continuation byte at byte 4 of the line)"
    )


def test_an_unterminated_quote_is_an_error_naming_the_file(tmp_path):
    path = write(tmp_path, 'sku,on_hand\n"A,1\n')

    assert "malformed CSV" in str(error_of(path))


def test_a_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_stock_csv(tmp_path / "absent.csv")


@pytest.mark.skipif(not SAMPLE.is_file(), reason="the shipped sample is not in this checkout")
def test_the_shipped_sample_stock_file_is_valid():
    levels = read_stock_csv(SAMPLE)

    assert len(levels) > 1000
    assert all(units >= 0 for units in levels.values())


@pytest.mark.postgres
async def test_a_stock_file_loads_into_the_database(warehouse, tmp_path):
    path = write(tmp_path, "sku,on_hand\n85123A,12\n15056bl,0\n15056BL,3\nBANK CHARGES,1\n")

    await warehouse.put_stock(read_stock_csv(path))

    assert await warehouse.stock(["85123A", "15056bl", "15056BL", "BANK CHARGES", "x"]) == {
        "85123A": StockLevel(12),
        "15056bl": StockLevel(0),
        "15056BL": StockLevel(3),
        "BANK CHARGES": StockLevel(1),
    }


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("rows", "said"),
    [("A,1\n", "loaded 1 stock level"), ("A,1\nB,2\n", "loaded 2 stock levels")],
    ids=["one", "two"],
)
async def test_stock_load_says_how_many_levels_it_loaded(clean_database, tmp_path, rows, said):
    path = write(tmp_path, f"sku,on_hand\n{rows}")
    options = ToolOptions(
        amqp_url="amqp://unused/",
        database=database_options(Settings(database_url=SecretStr(clean_database))),
        consumer="fulfilment",
    )
    echoed: list[str] = []

    await load_command(options, path, echo=echoed.append)

    assert echoed == [f"{said} from {path}"]


@pytest.mark.postgres
@pytest.mark.skipif(not SAMPLE.is_file(), reason="the shipped sample is not in this checkout")
async def test_the_shipped_sample_loads_twice_with_the_same_result(warehouse):
    levels = read_stock_csv(SAMPLE)

    await warehouse.put_stock(levels)
    await warehouse.put_stock(levels)

    stored = await warehouse.stock(levels)
    assert {sku: level.on_hand for sku, level in stored.items()} == levels


@pytest.mark.postgres
async def test_a_level_below_the_reserved_units_is_refused_naming_its_line(
    warehouse, clean_database, tmp_path
):
    await warehouse.put_stock({"A": 5, "B": 5, "C": 5})
    outcome = await warehouse.apply(order(("A", 3), ("C", 4)))
    assert outcome.kind is OutcomeKind.RESERVED
    path = write(tmp_path, "sku,on_hand\nB,0\nC,1\n\nA,2\n")
    options = ToolOptions(
        amqp_url="amqp://unused/",
        database=database_options(Settings(database_url=SecretStr(clean_database))),
        consumer="fulfilment",
    )

    with pytest.raises(CommandError) as raised:
        await load_command(options, path, echo=print)

    assert str(raised.value) == (
        f"{path}:3: on_hand 1 for 'C' would fall below the units already reserved for it;"
        " nothing was loaded (so would line 5)"
    )
    assert raised.value.exit_code is ExitCode.BAD_INPUT
    levels = await warehouse.stock(["A", "B", "C"])
    assert {sku: level.on_hand for sku, level in levels.items()} == {"A": 5, "B": 5, "C": 5}
