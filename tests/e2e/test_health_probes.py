"""The worker's probes against a real process: alive, but not ready without its database."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from harness import WorkerProcess, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.rabbitmq]


def get(port: int, path: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return int(answer.status), json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_worker_whose_database_does_not_answer_is_alive_but_not_ready(
    worker_env: dict[str, str], tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    closed = free_port()  # nothing listens there
    env = {
        **worker_env,
        "FULFILMENT_DATABASE_URL": f"postgresql+asyncpg://postgres@127.0.0.1:{closed}/none",
    }
    worker = WorkerProcess(env, tmp_path / "worker.log")
    workers.append(worker)  # killed at the end by the fixture
    worker.env["FULFILMENT_HTTP_PORT"] = str(worker.port)
    with worker.log_path.open("ab") as log:
        worker.process = subprocess.Popen(
            [sys.executable, "-m", "fulfilment"], env=worker.env, stdout=log, stderr=log
        )

    deadline = time.monotonic() + 30
    ready: tuple[int, dict[str, object]] | None = None
    while time.monotonic() < deadline:
        try:
            ready = get(worker.port, "/health/ready")
        except OSError:
            time.sleep(0.2)
            continue
        if ready[1].get("consumer"):
            break
        time.sleep(0.2)

    assert ready == (503, {"broker": True, "consumer": True, "database": False}), worker.log_tail()
    assert get(worker.port, "/health/live") == (200, {"status": "ok"})
