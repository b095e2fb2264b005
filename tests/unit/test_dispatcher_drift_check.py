"""The dispatcher's root builds the drift check from its setting: none at 0, the interval
exported either way (the alert on a check that stopped completing reads it)."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from fulfilment.entrypoints.dispatcher import drift_check
from fulfilment.observability.dispatcher_metrics import DispatcherMetrics
from fulfilment.settings import WarehouseSettings


@pytest.mark.parametrize(("interval", "built"), [(0.0, False), (300.0, True)])
async def test_the_drift_check_is_built_unless_its_interval_is_0(
    interval: float, *, built: bool
) -> None:
    metrics = DispatcherMetrics()
    engine = create_async_engine("postgresql+asyncpg://nobody@localhost/none")
    try:
        async with httpx.AsyncClient() as http:
            check = drift_check(
                WarehouseSettings(drift_interval_seconds=interval), engine, http, metrics
            )
    finally:
        await engine.dispose()

    assert (check is not None) is built
    if check is not None:
        assert check.interval_seconds == interval
    sample = metrics.registry.get_sample_value("fulfilment_stock_drift_interval_seconds")
    assert sample == interval
    # Nothing checked yet: no figures.
    assert (
        metrics.registry.get_sample_value("fulfilment_stock_drift_skus", {"kind": "unexplained"})
        is None
    )
