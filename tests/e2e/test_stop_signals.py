"""SIGTERM and SIGINT, sent once or again and again, stop each service with exit 0.

Against the real RabbitMQ and PostgreSQL: the worker, the relay and the dispatcher as
subprocesses. A repeated stop signal used to reach the relay after its event loop had closed
and Python's default handler was back, turning a clean stop into a ``KeyboardInterrupt`` and
exit 130.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.e2e.harness import WorkerProcess, spawn
from tests.e2e.relay_harness import RelayProcess, spawn_relay
from tests.e2e.warehouse_harness import DispatcherProcess

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.rabbitmq]

NOWHERE = "http://127.0.0.1:9/api/v1"
"""A warehouse URL the dispatcher never calls: nothing is recorded for it to send."""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("service", ["worker", "relay", "dispatcher"])
def test_a_service_stopped_by_a_signal_sent_again_and_again_drains_and_exits_0(
    service: str,
    signum: int,
    workers: list[WorkerProcess],
    relays: list[RelayProcess],
    relay_env: dict[str, str],
    tmp_path: Path,
) -> None:
    process: WorkerProcess
    if service == "worker":
        process = spawn(workers, relay_env, tmp_path)
    elif service == "relay":
        process = spawn_relay(relays, relay_env, tmp_path)
    else:
        env = {**relay_env, "FULFILMENT_WAREHOUSE_URL": NOWHERE, "FULFILMENT_WAREHOUSE_TOKEN": "t"}
        process = DispatcherProcess(env, tmp_path / "dispatcher.log")
        workers.append(process)
        process.start()

    code = process.stop_pressing(signum)

    log = process.log_path.read_text(errors="replace")
    assert "Traceback" not in log
    assert "KeyboardInterrupt" not in log
    assert code == 0, process.log_tail()
