"""The benchmark's arithmetic and table (bench/figures.py), which need no service."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

FIGURES_FILE = Path(__file__).resolve().parents[2] / "bench" / "figures.py"
# bench/ is a folder of scripts, not a package: the module is loaded from its file.
_spec = importlib.util.spec_from_file_location("bench_figures", FIGURES_FILE)
assert _spec is not None
assert _spec.loader is not None
figures = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = figures
_spec.loader.exec_module(figures)

# Depth 0 at t=0, 10 at t=1, still 10 at t=2 (nothing arrived), 20 at t=3.
SAMPLES = [(0.0, 0), (1.0, 10), (2.0, 10), (3.0, 20)]


def test_arrivals_are_interpolated_between_the_samples_around_each_level():
    assert figures.arrivals(SAMPLES, [5, 10, 15, 20]) == [0.5, 1.0, 2.5, 3.0]


def test_arrivals_of_every_message_in_one_pass_agree_with_reached_one_by_one():
    levels = range(1, 21)
    assert figures.arrivals(SAMPLES, levels) == [figures.reached(SAMPLES, k) for k in levels]


def test_a_level_the_first_sample_already_holds_arrived_at_that_sample():
    assert figures.reached([(7.0, 3), (8.0, 6)], 2) == 7.0


def test_a_level_the_depth_never_reached_is_an_error():
    with pytest.raises(ValueError, match="never reached 21"):
        figures.arrivals(SAMPLES, [20, 21])


def test_the_samples_spacing_is_their_median_gap_in_milliseconds():
    assert figures.spacing_ms([(0.0, 0), (0.01, 1), (0.03, 2), (0.04, 3)]) == 10.0
    assert math.isnan(figures.spacing_ms([(0.0, 0)]))


def test_percentile_is_linear_between_ranks_like_percentile_cont():
    values = [4.0, 1.0, 3.0, 2.0]
    assert figures.percentile(values, 0.5) == 2.5
    assert figures.percentile(values, 0.0) == 1.0
    assert figures.percentile(values, 1.0) == 4.0
    assert figures.percentile(values, 0.99) == pytest.approx(3.97)
    assert figures.percentile([5.0], 0.99) == 5.0
    assert math.isnan(figures.percentile([], 0.5))


def test_lag_percentiles_are_arrival_minus_commit_in_milliseconds():
    committed = [100.0 + i for i in range(101)]
    arrived = [c + i / 1000 for i, c in enumerate(committed)]  # lags 0 to 100 ms
    assert figures.lag_percentiles_ms(committed, arrived) == {
        "p50": 50.0,
        "p95": 95.0,
        "p99": 99.0,
        "max": 100.0,
    }
    assert figures.lag_percentiles_ms([], []) == {}


def test_lag_percentiles_refuse_commits_and_arrivals_that_do_not_pair():
    with pytest.raises(ValueError, match="2 commit times for 1 arrivals"):
        figures.lag_percentiles_ms([1.0, 2.0], [1.5])


def test_a_ratio_without_a_reference_figure_is_not_a_number():
    assert figures.ratio(3.0, 2.0) == 1.5
    assert math.isnan(figures.ratio(3.0, 0.0))
    assert math.isnan(figures.ratio(math.nan, 2.0))
    assert math.isnan(figures.ratio(3.0, math.nan))


def product(label, counted, drained, worker_cpu, rss=90.0):
    return figures.Row(
        label=label,
        counted=counted,
        drained=drained,
        lag_ms={"p50": counted / 100, "p95": 50.0, "p99": 80.0},
        cpu={"consumer": worker_cpu, "relay": 0.2, "broker": 0.2, "postgres": 0.3, "rest": 5.0},
        rss_mib={"consumer": rss, "relay": 80.0},
    )


def reference(label, drained, cpu):
    return figures.Row(
        label=label,
        counted=math.nan,
        drained=drained,
        cpu={"consumer": cpu, "broker": 0.2, "postgres": 0.6, "rest": 1.0},
        rss_mib={"consumer": 35.0},
    )


def test_the_cpu_total_leaves_the_rest_of_the_machine_out():
    assert product("p", 1000, 1200, 0.5).cpu_total == pytest.approx(1.2)
    assert math.isnan(figures.Row("none", 1.0, 1.0).cpu_total)


def test_median_row_takes_each_figures_median_and_the_highest_peak_rss():
    rows = [
        product("a", 1000, 1500, 0.5, rss=90),
        product("b", 1400, 1700, 0.7, rss=95),
        product("c", 1200, 1600, 0.6, rss=92),
    ]
    middle = figures.median_row("median", rows)
    assert (middle.counted, middle.drained) == (1200, 1600)
    assert middle.lag_ms == {"p50": 12.0, "p95": 50.0, "p99": 80.0}
    assert middle.cpu["consumer"] == 0.6
    assert middle.rss_mib == {"consumer": 95, "relay": 80.0}


def test_the_ratio_compares_both_product_rates_with_the_references_drain():
    compared = figures.ratio_row("ratio", product("p", 1500, 2000, 0.5), reference("r", 1000, 1.0))
    assert compared.counted == 1.5
    assert compared.drained == 2.0
    assert compared.cpu["consumer"] == 0.5
    assert math.isnan(compared.cpu["relay"])  # the reference has no relay
    assert compared.cpu["total"] == pytest.approx(1.2 / 1.8)
    assert "rest" not in compared.cpu


def test_the_median_of_the_rounds_ratios_pairs_each_drain_with_its_own_rounds_reference():
    # The machine's speed moved between the rounds: the product was 2x its round's reference
    # in two rounds of three, and the medians' ratio pairs drains of different rounds.
    products = [product("p", rate, rate, 0.5) for rate in (2000, 3000, 2000)]
    references = [reference("r", rate, 1.0) for rate in (1000, 1500, 2000)]
    rounds = [
        figures.ratio_row(str(index), mine, theirs)
        for index, (mine, theirs) in enumerate(zip(products, references, strict=True))
    ]

    middle = figures.median_ratio("median of the rounds", rounds)
    medians = figures.ratio_row(
        "medians", figures.median_row("p", products), figures.median_row("r", references)
    )

    assert (middle.counted, middle.drained) == (2.0, 2.0)
    assert medians.counted == pytest.approx(2000 / 1500)
    assert middle.cpu["consumer"] == 0.5
    assert math.isnan(middle.cpu["relay"])  # the reference has no relay in any round


def test_a_variant_is_compared_rate_for_rate_with_the_base_and_its_extra_processes_count():
    base = product("base", 1000, 1200, 0.5)
    variant = figures.Row(
        label="hand-off",
        counted=900,
        drained=1080,
        cpu={"consumer": 0.55, "relay": 0.2, "dispatcher": 0.3, "broker": 0.2, "postgres": 0.3},
    )
    compared = figures.relative_row("hand-off / base", variant, base)
    assert compared.counted == pytest.approx(0.9)
    assert compared.drained == pytest.approx(0.9)
    assert compared.cpu["consumer"] == pytest.approx(1.1)
    assert "dispatcher" not in compared.cpu  # the base runs none
    assert compared.cpu["total"] == pytest.approx(1.55 / 1.2)


def test_the_table_gives_the_figures_and_the_ratios_under_one_header():
    rows = [product("worker + relay", 1166, 1747, 0.5), reference("reference", 922, 1.0)]
    rows.append(figures.ratio_row("ratio", rows[0], rows[1]))
    lines = figures.comparison_table(
        rows, cpu_groups=["consumer", "relay", "broker", "postgres"], rss_processes=["consumer"]
    )
    assert lines[0].startswith("| drain | result events confirmed/s | orders drained/s |")
    assert lines[1] == "|" + "---|" * 13
    assert lines[2] == (
        "| worker + relay | 1,166 | 1,747 | 11.7 | 50.0 | 80.0 | 0.500 | 0.200 | 0.200 | 0.300"
        " | 1.200 | 5.000 | 90 |"
    )
    assert lines[3] == (
        "| reference | - | 922 | - | - | - | 1.000 | - | 0.200 | 0.600 | 1.800 | 1.000 | 35 |"
    )
    assert lines[4] == (
        "| ratio | 1.26x | 1.89x |  |  |  | 0.50x | - | 1.00x | 0.50x | 0.67x |  |  |"
    )


def test_a_row_that_does_not_fit_the_header_is_an_error():
    with pytest.raises(ValueError, match="a row of 1 cells under a header of 2"):
        figures.markdown_table(["a", "b"], [["1"]])


def test_without_events_the_table_leaves_the_counted_rate_and_the_lags_out():
    alone = figures.Row("worker", math.nan, 1747, cpu={"consumer": 0.5, "rest": 0.1})
    lines = figures.comparison_table([alone], ["consumer"], ["consumer"], events=False)
    assert lines[0] == (
        "| drain | orders drained/s | CPU s/1,000: consumer | CPU total"
        " | CPU rest of the machine | peak RSS MiB: consumer |"
    )
    assert lines[2] == "| worker | 1,747 | 0.500 | 0.500 | 0.100 | - |"
