"""HTTP endpoints beside the dispatcher: liveness, readiness and Prometheus metrics.

The same paths as the worker's and the relay's. Readiness says that the dispatcher is
connected to PostgreSQL and either sending (it holds the advisory lock) or standing by, and
that the warehouse system accepts its credentials: with a token refused it answers 503 with
``"halt": "credentials_refused"``, so the pod shows what an operator must fix. A warehouse that
is down (the circuit open) leaves it ready: it is doing its job, probing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from fulfilment.dispatcher.leadership import Leadership, Role
from fulfilment.dispatcher.service import Dispatcher, Halt
from fulfilment.observability.probes import ASGIApp, probe_app


@dataclass
class DispatcherState:
    """What ``/health/ready`` reports: the lock's role and the active loop's halt, if any.

    ``dispatcher`` is the loop running while this replica holds the lock, else None.
    """

    leadership: Leadership
    dispatcher: Dispatcher | None = None

    def readiness(self) -> dict[str, bool | str]:
        """``{"database": connected, "role": "active"|"standby"|"connecting", "halt": ...}``."""
        active = self.dispatcher is not None and self.leadership.role is Role.ACTIVE
        halt = self.dispatcher.halt if self.dispatcher is not None and active else Halt.NONE
        return {
            "database": self.leadership.role is not Role.CONNECTING,
            "role": str(self.leadership.role),
            "halt": str(halt),
        }

    def ready(self) -> bool:
        """Connected, sending or standing by, and the warehouse accepts the credentials."""
        checks = self.readiness()
        return bool(checks["database"]) and checks["halt"] != Halt.CREDENTIALS_REFUSED


def dispatcher_health_app(
    *,
    readiness: Callable[[], dict[str, bool | str]],
    ready: Callable[[], bool],
    registry: CollectorRegistry,
) -> ASGIApp:
    """An ASGI app serving ``GET /health/live``, ``GET /health/ready`` and ``GET /metrics``.

    ``/health/ready`` answers 200 when ``ready()``, else 503, with ``readiness()`` as its body
    (``{"database": true, "role": "active", "halt": "none"}``).
    """

    async def dispatcher_readiness() -> tuple[bool, dict[str, Any]]:
        return ready(), dict(readiness())

    return probe_app(readiness=dispatcher_readiness, registry=registry)
