"""The simulator's knobs: :class:`Faults`, each changeable at run time.

``POST /_simulator/faults`` with a JSON object of knobs changes them; its answer lists them all.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal


@dataclass
class Faults:
    """The knobs, all off by default; each can be changed at run time.

    Attributes:
        error_rate: fraction (0 to 1) of requests answered 503 ``unavailable`` without doing
            anything.
        latency_seconds: time every answer of the API takes, besides the work.
        stall_after_commit_rate: fraction (0 to 1) of requests that do their work and store
            their answer, then stall for ``stall_seconds`` before answering (a client's timeout
            sees nothing; its retry is answered as a replay).
        stall_seconds: how long such a request stalls.
        work_seconds: how long the work of a key's first request takes, while the key is in
            flight (a request with the same key meanwhile is answered 409 ``in_flight``).
        rate_limit_per_second: most requests of the API answered per sliding second; the
            others get 429 with ``Retry-After``. None: no limit.
        retry_after_seconds: the ``Retry-After`` of a 429; until it ends every request is 429.
        retry_after_format: ``seconds`` (a number) or ``http-date`` (RFC 9110's IMF-fixdate).
        down_until: ``time.monotonic()`` until which the API is down. Set it with
            :meth:`WarehouseSimulator.go_down` or ``down_for_seconds`` of the admin endpoint.
        down_mode: ``503`` (answers 503 ``unavailable``) or ``refuse`` (the server closes its
            listening socket: connections are refused; needs :class:`~.server.SimulatorServer`).
        pick_delay_seconds: how long after its creation an order is picked, after which a
            cancellation is refused ``too_late``. None: never picked.
        token: the Bearer token the API accepts; another one is answered 403, none 401.
        refused_skus: SKUs the warehouse does not stock: an order with one is answered 422.
    """

    error_rate: float = 0.0
    latency_seconds: float = 0.0
    stall_after_commit_rate: float = 0.0
    stall_seconds: float = 30.0
    work_seconds: float = 0.0
    rate_limit_per_second: float | None = None
    retry_after_seconds: float = 1.0
    retry_after_format: Literal["seconds", "http-date"] = "seconds"
    down_until: float = 0.0
    down_mode: Literal["503", "refuse"] = "503"
    pick_delay_seconds: float | None = None
    token: str = "simulator-token"  # noqa: S105 - the simulator's default, not a secret
    refused_skus: frozenset[str] = frozenset()

    def update(self, changes: dict[str, Any]) -> None:
        """Set the knobs named in ``changes`` (``down_for_seconds`` sets ``down_until``).

        Raises:
            ValueError: a name that is no knob, or a value of the wrong kind.
        """
        names = {f.name for f in fields(self)}
        for name, value in changes.items():
            if name == "down_for_seconds":
                self.down_until = time.monotonic() + _checked("down_until", value)
            elif name == "refused_skus":
                self.refused_skus = frozenset(str(sku) for sku in value)
            elif name not in names:
                msg = f"no knob {name!r}; knobs: {', '.join(sorted(names))}, down_for_seconds"
                raise ValueError(msg)
            else:
                setattr(self, name, _checked(name, value))

    def document(self) -> dict[str, Any]:
        """The knobs as JSON (``down_for_seconds``: what is left of the outage)."""
        document = asdict(self)
        document["refused_skus"] = sorted(self.refused_skus)
        document["down_for_seconds"] = max(0.0, self.down_until - time.monotonic())
        del document["down_until"]
        return document


CHOICES: dict[str, tuple[str, ...]] = {
    "retry_after_format": ("seconds", "http-date"),
    "down_mode": ("503", "refuse"),
}
"""The knobs that take one of a few words."""

OPTIONAL_NUMBERS = frozenset({"rate_limit_per_second", "pick_delay_seconds"})
"""The knobs that take a number or null (off)."""


def _checked(name: str, value: Any) -> Any:  # noqa: ANN401 - a knob's value, checked here
    """``value`` if knob ``name`` can take it.

    Raises:
        ValueError: a value of the wrong kind, or a negative number.
    """
    if name in CHOICES:
        if value not in CHOICES[name]:
            msg = f"{name} must be one of {', '.join(CHOICES[name])}"
            raise ValueError(msg)
        return value
    if name == "token":
        if not isinstance(value, str):
            msg = "token must be a string"
            raise ValueError(msg)
        return value
    if value is None and name in OPTIONAL_NUMBERS:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        msg = f"{name} must be a number >= 0" + (" or null" if name in OPTIONAL_NUMBERS else "")
        raise ValueError(msg)
    return float(value)
