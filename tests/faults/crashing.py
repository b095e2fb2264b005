"""A worker or a relay of the fault suite: the production root, with the crash plan's hooks.

Run as ``python tests/faults/crashing.py worker`` (or ``relay``) with the service's own
settings in the environment and the plan in ``FULFILMENT_TEST_CRASH_PLAN``
(``crash_plan``); the harness starts it instead of ``fulfilment worker``/``fulfilment relay``
when a scenario gives a plan. It exits as the production program does (2 for invalid
settings), and with 2 and one line on standard error for an invalid plan.
"""

from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path

# Run as a script (``python tests/faults/crashing.py``): the suite's packages are
# imported from the checkout's root.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import structlog

from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.entrypoints.relay import run_relay
from fulfilment.entrypoints.startup import run_service
from fulfilment.entrypoints.worker import run_worker
from fulfilment.settings import Settings
from tests.faults.crash_plan import (
    CRASH_PLAN_VARIABLE,
    CrashingRelayHooks,
    CrashingStock,
    FaultPlan,
    parse_fault_plan,
)

logger = structlog.get_logger("fulfilment.faults")


async def crashing_worker(plan: FaultPlan, settings: Settings) -> int:
    """``run_worker``, its stock store wrapped in the plan's crash points."""

    def wrap(inner: PostgresStock) -> CrashingStock:
        return CrashingStock(
            inner, plan, engine=inner.engine, consumer=settings.worker.consumer_name
        )

    logger.warning("worker.fault_injection_armed", plan=os.environ[CRASH_PLAN_VARIABLE])
    return await run_worker(settings, wrap_stock=wrap)


async def crashing_relay(plan: FaultPlan, settings: Settings) -> int:
    """``run_relay``, with the plan's crash points as its hooks."""
    return await run_relay(settings, hooks=CrashingRelayHooks(plan))


def main(program: str) -> None:
    """Run ``program`` (``worker`` or ``relay``) under the environment's crash plan."""
    try:
        plan = parse_fault_plan(os.environ.get(CRASH_PLAN_VARIABLE, ""))
    except ValueError as error:
        sys.stderr.write(f"{CRASH_PLAN_VARIABLE}: {error}\n")
        sys.exit(2)
    service = {"worker": crashing_worker, "relay": crashing_relay}[program]
    run_service(partial(service, plan))


if __name__ == "__main__":
    main(sys.argv[1])
