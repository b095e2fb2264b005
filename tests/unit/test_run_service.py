"""What every service's process gets from ``run_service`` before its coroutine runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fulfilment.entrypoints.startup import GC_YOUNG_THRESHOLD

# A process of its own: run_service configures logging and the collector for the whole
# process, which must not leak into the other tests.
SERVICE = """
import gc
from fulfilment.entrypoints.startup import run_service

async def service(_settings):
    print(*gc.get_threshold())
    return 0

gc.set_threshold(700, 10, 10)  # CPython's defaults
run_service(service)
"""


def test_a_service_runs_with_the_young_generation_collected_less_often_and_the_rest_as_before(
    tmp_path: Path,
) -> None:
    ran = subprocess.run(
        [sys.executable, "-c", SERVICE],
        cwd=tmp_path,  # no .env file
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == [str(GC_YOUNG_THRESHOLD), "10", "10"]
