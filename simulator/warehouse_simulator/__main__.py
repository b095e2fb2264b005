"""``python -m warehouse_simulator``: serve the simulated warehouse until SIGTERM or Ctrl-C.

Prints one line with the URL to give the service (``FULFILMENT_WAREHOUSE_URL``) and its token
(``FULFILMENT_WAREHOUSE_TOKEN``). The knobs can be changed while it runs with
``POST /_simulator/faults`` (a JSON object of knobs, e.g. ``{"error_rate": 0.1}``). With
``--ship-delay-seconds`` it ships and cancels on its own, with ``--receipts-per-second`` and the
like it adjusts the stock of the SKUs given a level (``POST /_simulator/inventory``), and with
``--webhook-url`` it tells the service by signed webhooks (the secret: ``--webhook-secret``,
repeated to sign with several; the simulator's default otherwise).
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

SPEAKING_KNOBS: dict[str, str] = {
    "ship_delay_seconds": "seconds from an order's creation to its first shipment (default:"
    " it never ships or cancels on its own)",
    "shipment_interval_seconds": "seconds between the shipments of one order",
    "split_rate": "fraction of orders shipped in several shipments",
    "max_shipments": "most shipments of one order",
    "cancel_rate": "fraction of an order's SKUs the warehouse cancels some units of",
    "webhook_url": "where the webhooks go, e.g. http://127.0.0.1:8083/webhooks/warehouse"
    " (default: none sent)",
    "webhook_timeout_seconds": "one attempt's timeout",
    "webhook_give_up_seconds": "a webhook not delivered this long after its first attempt is"
    " given up",
    "webhook_delay_seconds": "every webhook waits this long before its first attempt",
    "webhook_duplicate_rate": "fraction of delivered webhooks sent again, same webhook-id",
    "webhook_resend_rate": "fraction of changes sent again under a new webhook-id",
    "webhook_reorder_rate": "fraction of webhooks held back --webhook-hold-seconds",
    "webhook_hold_seconds": "how long a reordered webhook is held back",
    "webhook_never_rate": "fraction of changes never sent (only the poll finds them)",
    "webhook_wrong_secret_rate": "fraction of attempts signed with a wrong secret",
    "webhook_stale_rate": "fraction of attempts with a stale webhook-timestamp",
    "webhook_stale_seconds": "how old a stale webhook-timestamp is",
    "receipts_per_second": "goods received a second (inventory.adjusted, reason received)",
    "returns_per_second": "returns a second (reason returned)",
    "damages_per_second": "damages a second (reason damaged)",
    "losses_per_second": "losses a second (reason lost)",
    "counts_per_second": "shelf counts that differ a second (reason counted)",
    "adjustment_max_units": "most units of one adjustment the warehouse makes on its own",
}
"""The options of the warehouse's work, stock and webhooks: one per knob of :class:`Faults`."""


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
    defaults = Faults()
    for name, text in SPEAKING_KNOBS.items():
        default = getattr(defaults, name)
        kind = str if name == "webhook_url" else type(default) if default is not None else float
        shown = "" if default is None else f" (default {default})"
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, help=text + shown)
    parser.add_argument(
        "--webhook-secret",
        dest="webhook_secrets",
        action="append",
        help="a whsec_<base64> secret to sign with; repeat it to sign with several (rotation)",
    )
    parser.add_argument(
        "--webhook-retry-seconds",
        type=lambda text: [float(wait) for wait in text.split(",")],
        help="waits before the retries, comma-separated; the last repeats (default"
        f" {','.join(f'{wait:g}' for wait in defaults.webhook_retry_seconds)})",
    )
    parser.add_argument(
        "--webhook-concurrency", type=int, default=8, help="most webhook attempts in flight"
    )
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
    given = {
        name: getattr(arguments, name)
        for name in [*SPEAKING_KNOBS, "webhook_secrets", "webhook_retry_seconds"]
        if getattr(arguments, name) is not None
    }
    try:
        faults.update(given)
    except ValueError as error:
        sys.exit(f"warehouse simulator: {error}")
    simulator = WarehouseSimulator(
        faults,
        base_path=arguments.base_path,
        seed=arguments.seed,
        webhook_concurrency=arguments.webhook_concurrency,
    )
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
        if faults.webhook_url is not None:
            sys.stdout.write(
                f"warehouse simulator: webhooks to {faults.webhook_url}"
                f" FULFILMENT_WAREHOUSE_WEBHOOK_SECRETS={' '.join(faults.webhook_secrets)}\n"
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
