"""``python -m warehouse_simulator``: serve the simulated warehouse until SIGTERM or Ctrl-C.

Prints one line with the URL to give the service (``FULFILMENT_WAREHOUSE_URL``) and its token
(``FULFILMENT_WAREHOUSE_TOKEN``). The knobs can be changed while it runs with
``POST /_simulator/faults`` (a JSON object of knobs, e.g. ``{"error_rate": 0.1}``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys

from warehouse_simulator.app import WarehouseSimulator
from warehouse_simulator.knobs import Faults
from warehouse_simulator.server import SimulatorServer


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's options (``--help`` lists them)."""
    parser = argparse.ArgumentParser(
        prog="python -m warehouse_simulator", description="A simulated warehouse system (WMS)."
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8090, help="port to listen on")
    parser.add_argument("--base-path", default="/api/v1", help="path of the API")
    parser.add_argument("--token", default=Faults.token, help="the Bearer token accepted")
    parser.add_argument(
        "--pick-delay-seconds",
        type=float,
        default=None,
        help="seconds after its creation an order is picked (cancels then: too_late)",
    )
    parser.add_argument("--latency-seconds", type=float, default=0.0)
    parser.add_argument("--error-rate", type=float, default=0.0, help="fraction answered 503")
    parser.add_argument("--rate-limit-per-second", type=float, default=None)
    parser.add_argument("--retry-after-seconds", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None, help="seed of the fault knobs")
    return parser.parse_args(argv)


async def serve(arguments: argparse.Namespace) -> None:
    """Serve until SIGTERM or SIGINT."""
    faults = Faults(
        token=arguments.token,
        pick_delay_seconds=arguments.pick_delay_seconds,
        latency_seconds=arguments.latency_seconds,
        error_rate=arguments.error_rate,
        rate_limit_per_second=arguments.rate_limit_per_second,
        retry_after_seconds=arguments.retry_after_seconds,
    )
    simulator = WarehouseSimulator(faults, base_path=arguments.base_path, seed=arguments.seed)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    async with contextlib.AsyncExitStack() as stack:
        try:
            server = await stack.enter_async_context(
                SimulatorServer(simulator, host=arguments.host, port=arguments.port)
            )
        except OSError as error:
            reason = os.strerror(error.errno) if error.errno else str(error)
            sys.exit(
                f"warehouse simulator: cannot listen on {arguments.host}:{arguments.port}:"
                f" {reason}; choose another with --port (make: WAREHOUSE_PORT=...)"
            )
        sys.stdout.write(
            f"warehouse simulator: FULFILMENT_WAREHOUSE_URL={server.url}"
            f" FULFILMENT_WAREHOUSE_TOKEN={arguments.token} (admin: {server.admin_url}/stats)\n"
        )
        sys.stdout.flush()
        await stopping.wait()


def main(argv: list[str] | None = None) -> None:
    """Console entry: parse the options and serve.

    Raises:
        SystemExit: 1, with one line naming the address, when the port cannot be listened on
            (another process has it, or it needs privileges).
    """
    asyncio.run(serve(parse_arguments(argv)))


if __name__ == "__main__":
    main()
