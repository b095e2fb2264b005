"""`fulfilment dispatcher` refuses to start without a warehouse system to send to."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fulfilment.exit_codes import ExitCode


def dispatcher(tmp_path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {key: value for key, value in os.environ.items() if not key.startswith("FULFILMENT_")}
    return subprocess.run(
        [str(Path(sys.executable).parent / "fulfilment"), "dispatcher"],
        env={**clean, **env},
        cwd=tmp_path,  # no .env of the checkout
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_without_the_warehouse_url_it_exits_2_with_one_line_naming_it(tmp_path) -> None:
    result = dispatcher(tmp_path)
    assert result.returncode == ExitCode.BAD_INPUT
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "FULFILMENT_WAREHOUSE_URL" in lines[0]


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"FULFILMENT_WAREHOUSE_URL": "ftp://wms.example/api"}, "FULFILMENT_WAREHOUSE_URL"),
        (
            {
                "FULFILMENT_WAREHOUSE_URL": "https://wms.example/api",
                "FULFILMENT_WAREHOUSE_DRIFT_INTERVAL_SECONDS": "-60",
            },
            "FULFILMENT_WAREHOUSE_DRIFT_INTERVAL_SECONDS",
        ),
        (
            {
                "FULFILMENT_WAREHOUSE_URL": "https://wms.example/api",
                "FULFILMENT_WAREHOUSE_RATE_PER_SECOND": "0",
            },
            "FULFILMENT_WAREHOUSE_RATE_PER_SECOND",
        ),
        (
            {
                "FULFILMENT_WAREHOUSE_URL": "http://wms.example/api",
                "FULFILMENT_WAREHOUSE_CA_FILE": "/etc/ssl/ca.pem",
            },
            "FULFILMENT_WAREHOUSE_CA_FILE",
        ),
        (
            {
                "FULFILMENT_WAREHOUSE_URL": "https://wms.example/api",
                "FULFILMENT_WAREHOUSE_CA_FILE": "/nonexistent/ca.pem",
            },
            "FULFILMENT_WAREHOUSE_CA_FILE",
        ),
    ],
)
def test_an_invalid_warehouse_setting_exits_2_naming_it(tmp_path, env, named) -> None:
    result = dispatcher(tmp_path, **env)
    assert result.returncode == ExitCode.BAD_INPUT
    assert named in result.stderr
