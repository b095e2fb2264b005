"""The README's first command, ``fulfilment demo``, on the shipped sample of real orders."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.rabbitmq]

SAMPLE = Path(__file__).parents[2] / "data" / "sample" / "online-retail"


def demo(env: dict[str, str], *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).with_name("fulfilment")), "demo", str(SAMPLE), *arguments],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


async def stock_fingerprint(db: asyncpg.Connection) -> tuple[int, int, str]:
    row = await db.fetchrow(
        "SELECT count(*), sum(reserved),"
        " md5(string_agg(sku || ':' || reserved, ',' ORDER BY sku)) FROM stock_levels"
    )
    return int(row[0]), int(row[1]), str(row[2])


async def test_the_demo_reserves_the_sample_and_a_second_run_changes_nothing(
    worker_env: dict[str, str], db: asyncpg.Connection
) -> None:
    first = demo(worker_env, "--reset")
    assert first.returncode == 0, first.stderr[-2000:]
    assert (
        "reconciled 170 published events: 170 processed, 0 in the dead-letter queue, 0 missing"
        in first.stdout
    )
    assert (
        "this run's outcomes: rejected:insufficient_stock 31, rejected:unknown_sku 7, "
        "reserved 132" in first.stdout
    )
    assert "stock invariants               hold" in first.stdout
    before = await stock_fingerprint(db)
    reservations = await db.fetchval("SELECT count(*) FROM reservations")

    second = demo(worker_env)

    assert second.returncode == 0, second.stderr[-2000:]
    assert "this run's outcomes: duplicate:event 170" in second.stdout
    assert await stock_fingerprint(db) == before
    assert await db.fetchval("SELECT count(*) FROM reservations") == reservations == 170
