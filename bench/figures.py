"""The benchmark's arithmetic and its table: pure functions, no service, no clock.

``run.py`` measures; this module turns the measurements into figures (arrival times from a
queue's sampled depth, lag percentiles, medians, ratios) and the figures into Markdown.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

Sample = tuple[float, int]
"""``(time.time(), depth)``: one read of a queue's depth, in seconds since the epoch."""

LAG_QUANTILES = (0.5, 0.95, 0.99)
"""The commit-to-confirm percentiles the report gives (p50, p95, p99)."""
LAG_COLUMNS = tuple(f"p{round(q * 100)}" for q in LAG_QUANTILES)
"""Their keys in :func:`lag_percentiles_ms`' result: ``p50``, ``p95``, ``p99``."""


def reached(samples: Sequence[Sample], level: int) -> float:
    """When the depth first reached ``level``, interpolated linearly between two samples.

    ``samples`` are in time order and the depth never falls (nobody consumes the queue).

    Raises:
        ValueError: no sample reached ``level``.
    """
    return arrivals(samples, [level])[0]


def arrivals(samples: Sequence[Sample], levels: Sequence[int]) -> list[float]:
    """For each of ``levels`` (ascending), the moment the depth reached it (see :func:`reached`).

    The ``k``-th message of a queue nobody consumes arrived when its depth reached ``k``: one
    pass over the samples gives every message's arrival time, to within the samples' spacing
    (the arrivals between two samples are taken as evenly spread).

    Raises:
        ValueError: a level is above every sample's depth.
    """
    found: list[float] = []
    if not samples:
        msg = "no depth samples"
        raise ValueError(msg)
    index = 0
    before_time, before_depth = samples[0]
    for level in levels:
        while index < len(samples) and samples[index][1] < level:
            before_time, before_depth = samples[index]
            index += 1
        if index == len(samples):
            msg = f"the depth never reached {level}"
            raise ValueError(msg)
        moment, depth = samples[index]
        if depth == before_depth or index == 0:
            found.append(moment)
        else:
            share = (level - before_depth) / (depth - before_depth)
            found.append(before_time + (moment - before_time) * share)
    return found


def spacing_ms(samples: Sequence[Sample]) -> float:
    """The median time between two samples, in ms: what the arrival times are good to.

    ``nan`` for fewer than two samples.
    """
    gaps = [(later[0] - earlier[0]) * 1000 for earlier, later in itertools.pairwise(samples)]
    return round(median(gaps), 1)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0 to 1) of ``values``, linear between ranks.

    The same definition as PostgreSQL's ``percentile_cont``, which the database-side figures
    use; ``nan`` for no values.
    """
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def lag_percentiles_ms(
    committed: Sequence[float], arrived: Sequence[float], quantiles: Sequence[float] = LAG_QUANTILES
) -> dict[str, float]:
    """``{"p50": ms, "p95": ms, "p99": ms, "max": ms}`` of ``arrived[i] - committed[i]``.

    Both in seconds since the epoch, one pair per event; the result in milliseconds, rounded
    to 0.1 ms. Empty for no events.

    Raises:
        ValueError: the two sequences differ in length.
    """
    if len(committed) != len(arrived):
        msg = f"{len(committed)} commit times for {len(arrived)} arrivals"
        raise ValueError(msg)
    if not committed:
        return {}
    lags = [(a - c) * 1000 for c, a in zip(committed, arrived, strict=True)]
    figures = {f"p{round(q * 100)}": round(percentile(lags, q), 1) for q in quantiles}
    return figures | {"max": round(max(lags), 1)}


def median(values: Sequence[float]) -> float:
    """The median of ``values``; ``nan`` for none."""
    return statistics.median(values) if values else math.nan


def ratio(product: float, reference: float) -> float:
    """``product / reference``; ``nan`` when either is missing (``nan``) or the reference is 0."""
    if math.isnan(product) or math.isnan(reference) or reference == 0:
        return math.nan
    return product / reference


def number(value: float | None, digits: int = 0) -> str:
    """``1,234`` (thousands separated, ``digits`` decimals); ``-`` for none or ``nan``."""
    if value is None or math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}"


def times(value: float) -> str:
    """A ratio as ``1.97x``; ``-`` for ``nan``."""
    return "-" if math.isnan(value) else f"{value:.2f}x"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table, one string per line.

    Raises:
        ValueError: a row has not as many cells as the header.
    """
    for row in rows:
        if len(row) != len(header):
            msg = f"a row of {len(row)} cells under a header of {len(header)}: {row}"
            raise ValueError(msg)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the comparison: a drain, or the medians of several.

    ``counted`` is the headline rate (orders per second whose result event was confirmed;
    ``nan`` for a consumer that publishes nothing), ``drained`` the rate at which orders were
    committed and acknowledged. ``lag_ms`` holds ``p50``/``p95``/``p99`` commit -> confirm in
    milliseconds, ``cpu`` CPU seconds per 1,000 orders by group (``rest`` is the rest of the
    machine and not part of the total), ``rss_mib`` peak RSS by process.
    """

    label: str
    counted: float
    drained: float
    lag_ms: Mapping[str, float] = field(default_factory=dict)
    cpu: Mapping[str, float] = field(default_factory=dict)
    rss_mib: Mapping[str, float] = field(default_factory=dict)

    @property
    def cpu_total(self) -> float:
        """CPU seconds per 1,000 orders of every group but ``rest``; ``nan`` for none."""
        spent = [seconds for group, seconds in self.cpu.items() if group != "rest"]
        return sum(spent) if spent else math.nan


@dataclass(frozen=True, slots=True)
class Ratio:
    """Product / reference: both rates over the reference's drain, CPU group by group.

    The reference publishes nothing, so it is compared on its drain ("reference (publishes
    nothing)" in issue 23's table) for the product's counted rate as for its drain rate.
    """

    label: str
    counted: float
    drained: float
    cpu: Mapping[str, float]


def median_row(label: str, rows: Sequence[Row]) -> Row:
    """Each figure's median over ``rows`` (a figure missing from a row is left out there)."""

    def medians(pick: Callable[[Row], Mapping[str, float]]) -> dict[str, float]:
        keys = list(dict.fromkeys(key for row in rows for key in pick(row)))
        return {key: median([pick(row)[key] for row in rows if key in pick(row)]) for key in keys}

    return Row(
        label=label,
        counted=median([row.counted for row in rows]),
        drained=median([row.drained for row in rows]),
        lag_ms=medians(lambda row: row.lag_ms),
        cpu=medians(lambda row: row.cpu),
        rss_mib={
            key: max(row.rss_mib[key] for row in rows if key in row.rss_mib)
            for key in dict.fromkeys(key for row in rows for key in row.rss_mib)
        },
    )


def ratio_row(label: str, product: Row, reference: Row) -> Ratio:
    """``product`` over ``reference`` (see :class:`Ratio`); CPU's total too, ``rest`` not."""
    groups = [group for group in product.cpu if group != "rest"]
    return Ratio(
        label=label,
        counted=ratio(product.counted, reference.drained),
        drained=ratio(product.drained, reference.drained),
        cpu={
            group: ratio(product.cpu[group], reference.cpu.get(group, math.nan)) for group in groups
        }
        | {"total": ratio(product.cpu_total, reference.cpu_total)},
    )


def median_ratio(label: str, ratios: Sequence[Ratio]) -> Ratio:
    """Each figure's median over ``ratios``, the rounds' own (a figure missing is left out).

    Each round's ratio compares two drains run one after the other; when the machine's speed
    moves during a run, the median of those can differ from the ratio of the medians, which
    pairs drains of different rounds.
    """
    keys = list(dict.fromkeys(key for each in ratios for key in each.cpu))
    return Ratio(
        label=label,
        counted=median([each.counted for each in ratios]),
        drained=median([each.drained for each in ratios]),
        cpu={key: median([each.cpu[key] for each in ratios if key in each.cpu]) for key in keys},
    )


def relative_row(label: str, variant: Row, base: Row) -> Ratio:
    """``variant`` over ``base``, both of the product: each rate over the same rate.

    CPU group by group; a group the base has not (a process only the variant runs) is left
    out, and counts in the total.
    """
    groups = [group for group in variant.cpu if group != "rest" and group in base.cpu]
    return Ratio(
        label=label,
        counted=ratio(variant.counted, base.counted),
        drained=ratio(variant.drained, base.drained),
        cpu={group: ratio(variant.cpu[group], base.cpu[group]) for group in groups}
        | {"total": ratio(variant.cpu_total, base.cpu_total)},
    )


def comparison_table(
    rows: Sequence[Row | Ratio],
    cpu_groups: Sequence[str],
    rss_processes: Sequence[str],
    *,
    events: bool = True,
) -> list[str]:
    """The benchmark's table, one Markdown line per string.

    Columns: the counted rate (the headline), the drain's rate, commit -> confirm
    p50/p95/p99, CPU seconds per 1,000 orders for each of ``cpu_groups`` then their total and
    the rest of the machine, peak RSS for each of ``rss_processes``. A :class:`Ratio` fills
    the rates and CPU with ``1.23x`` and leaves the rest blank. Without ``events`` (nothing
    published, the worker alone) the counted rate and the lags are left out.
    """
    lags = LAG_COLUMNS if events else ()
    header = [
        "drain",
        *(["result events confirmed/s"] if events else []),
        "orders drained/s",
        *(f"commit -> confirm {q} ms" for q in lags),
        *(f"CPU s/1,000: {group}" for group in cpu_groups),
        "CPU total",
        "CPU rest of the machine",
        *(f"peak RSS MiB: {process}" for process in rss_processes),
    ]
    lines = []
    for row in rows:
        if isinstance(row, Ratio):
            cells = [
                row.label,
                *([times(row.counted)] if events else []),
                times(row.drained),
                *("" for _ in lags),
                *(times(row.cpu.get(group, math.nan)) for group in cpu_groups),
                times(row.cpu["total"]),
                "",
                *("" for _ in rss_processes),
            ]
        else:
            cells = [
                row.label,
                *([number(row.counted)] if events else []),
                number(row.drained),
                *(number(row.lag_ms.get(q), 1) for q in lags),
                *(number(row.cpu.get(group), 3) for group in cpu_groups),
                number(row.cpu_total, 3),
                number(row.cpu.get("rest"), 3),
                *(number(row.rss_mib.get(process)) for process in rss_processes),
            ]
        lines.append(cells)
    return markdown_table(header, lines)
