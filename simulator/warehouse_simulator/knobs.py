"""The simulator's knobs: :class:`Faults`, each changeable at run time.

``POST /_simulator/faults`` with a JSON object of knobs changes them; its answer lists them all.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

DEFAULT_WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"warehouse-simulator-webhooks-01").decode()
"""The secret the simulator signs its webhooks with unless told another (``--webhook-secret``):
the simulator's default, as its token is, for a local run; never a production secret."""

DEFAULT_RETRY_SECONDS = (0.1, 0.5, 2.0, 5.0, 10.0, 30.0)
"""Waits before a webhook's retries: a compressed Standard Webhooks schedule (immediately,
5 s, 5 min, 30 min, 2 h, ...), so that a test or the demo sees retries within seconds."""


@dataclass
class Faults:
    """The knobs; the faults are off by default, and the warehouse neither ships nor speaks.

    The API's knobs:

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

    The warehouse's work (:mod:`~.shipping`), on the orders received while
    ``ship_delay_seconds`` is set:

    Attributes:
        ship_delay_seconds: seconds from an order's creation to the warehouse's work on it: it
            cancels the lines it cannot find, then ships the first shipment; a cancellation by
            the shop is refused ``too_late`` from then on. None: it never ships or cancels.
        shipment_interval_seconds: seconds between the shipments of one order.
        split_rate: fraction (0 to 1) of orders shipped in more than one shipment.
        max_shipments: most shipments of one order (a split makes 2 to this many, never more
            than the units left).
        cancel_rate: fraction (0 to 1) of an order's SKUs of which the warehouse cancels 1 to
            all the units left, reason ``unfulfillable``; all of everything left is a
            cancellation without lines.
        work_held: while true the warehouse does none of its work (cancels, shipments): what
            falls due waits, and is done once it is false again. A pick is still a pick: a
            shop's cancellation after ``pick_delay_seconds`` is refused ``too_late``.

    The webhooks (:mod:`~.webhooks`; Standard Webhooks 1.0, signed with the
    ``standardwebhooks`` package), sent for every shipment and cancellation of the warehouse's
    own while ``webhook_url`` is set:

    Attributes:
        webhook_url: where they go, e.g. ``http://127.0.0.1:8083/webhooks/warehouse``. None:
            none is sent (the shipments are still listed by ``GET {base}/fulfilment-orders/{id}``).
        webhook_secrets: the ``whsec_<base64>`` secrets each attempt is signed with, one
            signature per secret (rotation).
        webhook_timeout_seconds: one attempt's timeout; a timeout is retried like a non-2xx.
        webhook_retry_seconds: waits before the retries of a non-2xx, a timeout or a refused
            connection; after the last, retries go on at the last wait. The ``webhook-id`` is
            the same on every retry, ``webhook-timestamp`` the attempt's. A 410 stops them.
        webhook_give_up_seconds: a webhook not delivered this long after its first attempt is
            given up.
        webhook_delay_seconds: every webhook's first attempt waits this long after its change.
        webhook_duplicate_rate: fraction (0 to 1) of delivered webhooks sent again, same
            ``webhook-id`` and body.
        webhook_resend_rate: fraction (0 to 1) of changes sent once more under a new
            ``webhook-id``, once the first webhook's delivery ended.
        webhook_reorder_rate: fraction (0 to 1) of webhooks held back ``webhook_hold_seconds``,
            so that later ones overtake them.
        webhook_hold_seconds: how long such a webhook is held back.
        webhook_never_rate: fraction (0 to 1) of changes never sent: only the poll finds them.
        webhook_wrong_secret_rate: fraction (0 to 1) of attempts signed with a secret the
            receiver does not know (its retries may be signed right).
        webhook_stale_rate: fraction (0 to 1) of attempts whose ``webhook-timestamp`` is
            ``webhook_stale_seconds`` old (signed with it: only the tolerance refuses them).
        webhook_stale_seconds: how old a stale attempt's timestamp is.

    The shelves (:mod:`~.stock`): adjustments the warehouse makes on its own, each an
    ``inventory.adjusted`` webhook sent like the others, on a SKU chosen at random among those
    given a level; each rate is the mean number a second (Poisson arrivals), 0: none.

    Attributes:
        receipts_per_second: goods received, reason ``received``: +1 to
            ``adjustment_max_units``.
        returns_per_second: units returned, reason ``returned``: +1 to ``adjustment_max_units``.
        damages_per_second: units found damaged, reason ``damaged``: -1 to
            ``adjustment_max_units``, never below 0 on hand.
        losses_per_second: units lost, reason ``lost``: as a damage.
        counts_per_second: shelf counts that differ from the record, reason ``counted``: up to
            ``adjustment_max_units`` either way, never below 0 on hand.
        adjustment_max_units: the most units of one adjustment the warehouse makes on its own.
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

    ship_delay_seconds: float | None = None
    shipment_interval_seconds: float = 0.0
    split_rate: float = 0.3
    max_shipments: int = 3
    cancel_rate: float = 0.0
    work_held: bool = False

    webhook_url: str | None = None
    webhook_secrets: tuple[str, ...] = (DEFAULT_WEBHOOK_SECRET,)
    webhook_timeout_seconds: float = 5.0
    webhook_retry_seconds: tuple[float, ...] = DEFAULT_RETRY_SECONDS
    webhook_give_up_seconds: float = 3600.0
    webhook_delay_seconds: float = 0.0
    webhook_duplicate_rate: float = 0.0
    webhook_resend_rate: float = 0.0
    webhook_reorder_rate: float = 0.0
    webhook_hold_seconds: float = 2.0
    webhook_never_rate: float = 0.0
    webhook_wrong_secret_rate: float = 0.0
    webhook_stale_rate: float = 0.0
    webhook_stale_seconds: float = 600.0

    receipts_per_second: float = 0.0
    returns_per_second: float = 0.0
    damages_per_second: float = 0.0
    losses_per_second: float = 0.0
    counts_per_second: float = 0.0
    adjustment_max_units: int = 5

    def update(self, changes: dict[str, Any]) -> None:
        """Set the knobs named in ``changes`` (``down_for_seconds`` sets ``down_until``).

        All or nothing: when one is refused, none is changed.

        Raises:
            ValueError: a name that is no knob, or a value of the wrong kind.
        """
        names = {f.name for f in fields(self)}
        checked: dict[str, Any] = {}
        for name, value in changes.items():
            if name == "down_for_seconds":
                checked["down_until"] = time.monotonic() + _checked("down_until", value)
            elif name == "refused_skus":
                checked[name] = frozenset(str(sku) for sku in value)
            elif name not in names:
                msg = f"no knob {name!r}; knobs: {', '.join(sorted(names))}, down_for_seconds"
                raise ValueError(msg)
            else:
                checked[name] = _checked(name, value)
        for name, value in checked.items():
            setattr(self, name, value)

    def document(self) -> dict[str, Any]:
        """The knobs as JSON (``down_for_seconds``: what is left of the outage).

        The webhook secrets are listed: the simulator is a test tool, and a test reads them.
        """
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

OPTIONAL_NUMBERS = frozenset({"rate_limit_per_second", "pick_delay_seconds", "ship_delay_seconds"})
"""The knobs that take a number or null (off)."""

COUNTS = frozenset({"max_shipments", "adjustment_max_units"})
"""The knobs that take an integer >= 1."""


def _checked(name: str, value: Any) -> Any:  # noqa: ANN401 - a knob's value, checked here
    """``value`` if knob ``name`` can take it.

    Raises:
        ValueError: a value of the wrong kind, a negative number, a rate above 1.
    """
    if name in CHOICES:
        if value not in CHOICES[name]:
            msg = f"{name} must be one of {', '.join(CHOICES[name])}"
            raise ValueError(msg)
        return value
    return _CHECKS.get(name, _number)(name, value)


def _number(name: str, value: object) -> float | int | None:
    """A number >= 0; a fraction for a ``*_rate``; an integer >= 1 for :data:`COUNTS`."""
    if value is None and name in OPTIONAL_NUMBERS:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        msg = f"{name} must be a number >= 0" + (" or null" if name in OPTIONAL_NUMBERS else "")
        raise ValueError(msg)
    if name.endswith("_rate") and value > 1:
        msg = f"{name} must be a fraction from 0 to 1"
        raise ValueError(msg)
    if name in COUNTS:
        if not isinstance(value, int) or value < 1:
            msg = f"{name} must be an integer >= 1"
            raise ValueError(msg)
        return value
    return float(value)


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        msg = f"{name} must be true or false"
        raise ValueError(msg)  # noqa: TRY004 - every refused knob is a ValueError (a 400)
    return value


def _token(name: str, value: object) -> str:
    if not isinstance(value, str):
        msg = f"{name} must be a string"
        raise ValueError(msg)  # noqa: TRY004 - every refused knob is a ValueError (a 400)
    return value


def _url(name: str, value: object) -> str | None:
    if value is not None and not (isinstance(value, str) and value.startswith("http")):
        msg = f"{name} must be an http(s) URL or null"
        raise ValueError(msg)
    return value


def _waits(name: str, value: object) -> tuple[float, ...]:
    if not isinstance(value, list | tuple) or not value:
        msg = f"{name} must be a non-empty list of numbers >= 0"
        raise ValueError(msg)
    return tuple(float(_number(name, wait) or 0.0) for wait in value)


def _secrets(_name: str, value: object) -> tuple[str, ...]:
    """``whsec_<base64>`` secrets, from a list or one string separated by spaces.

    Raises:
        ValueError: none, or one that is not ``whsec_`` and base64.
    """
    secrets = value.split() if isinstance(value, str) else value
    if not isinstance(secrets, list | tuple) or not secrets:
        msg = "webhook_secrets must be one or more whsec_<base64> secrets"
        raise ValueError(msg)
    for secret in secrets:
        if not isinstance(secret, str) or not secret.startswith("whsec_"):
            msg = "webhook_secrets must be whsec_<base64> secrets"
            raise ValueError(msg)
        try:
            key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
        except binascii.Error:
            key = b""
        if not key:
            msg = "a webhook secret must be whsec_ followed by base64 of its bytes"
            raise ValueError(msg)
    return tuple(secrets)


_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "token": _token,
    "work_held": _flag,
    "webhook_url": _url,
    "webhook_secrets": _secrets,
    "webhook_retry_seconds": _waits,
}
"""The knobs that are no number, by name (the others: :func:`_number`)."""
