"""What the worker's per-delivery log line costs: CPU microseconds per ``*.handled`` line.

Configures logging as the worker does (JSON, level INFO), writes one ``order_placed.handled``
line per call to a logger bound as ``worker.delivery`` binds it, with standard error sent to
``/dev/null``, and prints the best of ``--repeats`` runs of ``--lines`` calls, in CPU time (so
another process on the machine changes it little). To compare with another version, run this
file with that version's ``src/`` first on the path, e.g.
``PYTHONPATH=/tmp/old/src uv run python bench/log_line.py``.

Run: ``uv run python bench/log_line.py [--lines N] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import structlog

from fulfilment.observability.logging import configure_logging

EVENT_ID = "7d48686f-66be-4357-a391-202f48fb5965"
ORDER_ID = "1d626d1a-b1a1-45ff-849d-3aa495c57b32"


def main() -> None:
    """Print the CPU microseconds of one delivery line, the best of the repeats."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    out = sys.stdout
    with open(os.devnull, "w", encoding="utf-8") as devnull:  # noqa: PTH123 - a stream, not a path
        sys.stderr = devnull
        configure_logging(level="INFO", log_format="json")
        logger = structlog.get_logger("fulfilment.worker")
        best = float("inf")
        for _ in range(args.repeats):
            started = time.process_time()
            for _ in range(args.lines):
                logger.bind(message_id=EVENT_ID, delivery_count=1, redelivered=False).info(
                    "order_placed.handled",
                    event_id=EVENT_ID,
                    order_id=ORDER_ID,
                    outcome="reserved",
                    skus=None,
                    duration_ms=12.5,
                )
            best = min(best, (time.process_time() - started) / args.lines)
        sys.stderr = sys.__stderr__
    out.write(
        f"one delivery line: {best * 1e6:.1f} µs of CPU (best of {args.repeats} x {args.lines:,})\n"
    )


if __name__ == "__main__":
    main()
