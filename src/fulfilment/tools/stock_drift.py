"""``fulfilment stock drift``: the warehouse's on hand beside the service's; changes nothing.

Both sides are read and compared by ``adapters.warehouse.drift`` (its text states the rule:
``agrees``, ``in_flight``, ``unexplained``), the code the dispatcher's scheduled check runs too;
this module prints the report. An adjustment the warehouse made but the service has not
recorded yet (its webhook is still being retried) is unexplained until it arrives: run the
command again.

Exit 0 when no SKU is unexplained, 1 (after the report) when one is.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import httpx
from aiolimiter import AsyncLimiter

from fulfilment.adapters.postgres.admin import stock_session
from fulfilment.adapters.warehouse.drift import DriftReport, DriftState, SkuDrift, read_drift
from fulfilment.adapters.warehouse.inventory import (
    InventoryReadError,
    InventoryRefusedError,
    InventoryUnavailableError,
)
from fulfilment.exit_codes import ExitCode
from fulfilment.tools.command import CommandError, Echo, ToolOptions

ORDERS_SHOWN = 5
"""Orders named per SKU in the text report (``--json`` names them all)."""


async def drift_command(  # noqa: PLR0913 - the two sides' means, and the output's
    options: ToolOptions,
    http: httpx.AsyncClient,
    limiter: AsyncLimiter,
    *,
    timeout_seconds: float,
    as_json: bool,
    echo: Echo,
) -> DriftReport:
    """``fulfilment stock drift``: read both sides, print the SKUs that differ and a summary.

    Args:
        options: where PostgreSQL is.
        http: the warehouse client's pooled client (base URL, token, CA, timeouts).
        limiter: the warehouse's rate cap, one token per request.
        timeout_seconds: one request's bound.
        as_json: one JSON document (:func:`report_document`) instead of the text.
        echo: standard output.

    Raises:
        CommandError: a SKU is ``unexplained`` (exit 1, after the report); the warehouse does
            not answer (exit 3), refuses the credentials (exit 4) or answers something that is
            no inventory (exit 1).
        DatabaseUnavailableError: PostgreSQL does not answer.
    """
    try:
        async with stock_session(options.database, consumer=options.consumer) as stock:
            report = await read_drift(stock.engine, http, limiter, timeout_seconds=timeout_seconds)
    except InventoryUnavailableError as error:
        raise CommandError(str(error), ExitCode.UNAVAILABLE) from error
    except InventoryRefusedError as error:
        raise CommandError(str(error), ExitCode.REFUSED) from error
    except InventoryReadError as error:
        raise CommandError(str(error)) from error
    if as_json:
        echo(json.dumps(report_document(report), indent=2))
    else:
        for line in render_report(report):
            echo(line)
    unexplained = report.count(DriftState.UNEXPLAINED)
    if unexplained:
        names = ", ".join(
            sku.sku for sku in report.differing if sku.state is DriftState.UNEXPLAINED
        )
        msg = f"{unexplained} SKU(s) differ from the warehouse beyond the orders in flight: {names}"
        raise CommandError(msg)
    return report


def report_document(report: DriftReport) -> dict[str, Any]:
    """The report as JSON: ``as_of``, the counts by state, and every SKU that differs."""
    return {
        "as_of": report.as_of.isoformat(),
        "compared": len(report.skus),
        **{state.value: report.count(state) for state in DriftState},
        "skus": [_sku_document(sku) for sku in report.differing],
    }


def _sku_document(sku: SkuDrift) -> dict[str, Any]:
    document = asdict(sku)
    document["state"] = sku.state.value
    document["orders"] = [
        {**asdict(order), "order_id": str(order.order_id)} for order in sku.orders
    ]
    return document


def render_report(report: DriftReport) -> Sequence[str]:
    """The text report: one line per SKU that differs, then the summary line."""
    lines = []
    differing = report.differing
    if differing:
        lines.append(
            f"{'SKU':<20}  {'WAREHOUSE':>9}  {'SERVICE':>9}  {'DIFF':>6}  {'IN FLIGHT':>9}"
            f"  {'STATE':<11}  ORDERS (warehouse id, units held)"
        )
    for sku in differing:
        shown = ", ".join(
            f"{order.order_id} ({order.warehouse_id or order.status}, {order.units})"
            for order in sku.orders[:ORDERS_SHOWN]
        )
        if len(sku.orders) > ORDERS_SHOWN:
            shown += f", and {len(sku.orders) - ORDERS_SHOWN} more"
        lines.append(
            f"{sku.sku:<20}  {sku.warehouse_on_hand:>9}  {sku.service_on_hand:>9}"
            f"  {sku.difference:>+6}  {sku.in_flight:>9}  {sku.state.value:<11}  {shown or '-'}"
        )
    lines.append(
        f"{len(report.skus)} SKU(s) compared with the warehouse's inventory as of"
        f" {report.as_of.isoformat()}: {report.count(DriftState.AGREES)} agree,"
        f" {report.count(DriftState.IN_FLIGHT)} differ by units of orders in flight,"
        f" {report.count(DriftState.UNEXPLAINED)} unexplained"
    )
    return lines
