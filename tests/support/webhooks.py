"""Helpers of the intake's tests: signed requests, webhook bodies, intake processes.

Signatures are made by the ``standardwebhooks`` package (``Webhook(secret).sign``), as the
warehouse's senders make them.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks import Webhook

from tests.e2e.harness import free_port

SECRET = "whsec_" + base64.b64encode(b"the warehouse's first secret!!!").decode()
"""The secret the intake of these tests knows first."""
SECOND_SECRET = "whsec_" + base64.b64encode(b"the warehouse's rotated secret!").decode()
"""The secret it knows beside it (a rotation under way)."""
UNKNOWN_SECRET = "whsec_" + base64.b64encode(b"a secret the intake never saw..").decode()

WEBHOOK_PATH = "/webhooks/warehouse"


def signed_headers(
    body: bytes,
    *,
    webhook_id: str | None = None,
    timestamp: int | None = None,
    secrets: tuple[str, ...] = (SECRET,),
) -> dict[str, str]:
    """The three Standard Webhooks headers of ``body``, one ``v1`` entry per secret."""
    webhook_id = webhook_id or f"msg_{uuid.uuid4().hex}"
    timestamp = int(time.time()) if timestamp is None else timestamp
    sent_at = datetime.fromtimestamp(timestamp, tz=UTC)
    signature = " ".join(Webhook(secret).sign(webhook_id, sent_at, body) for secret in secrets)
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature,
        "content-type": "application/json",
    }


def shipment_body(
    order_id: uuid.UUID,
    lines: list[tuple[str, int]],
    *,
    shipment_id: str | None = None,
    **data: Any,
) -> bytes:
    """A ``shipment.shipped`` body of ``lines`` of the order ``order_id``."""
    document = {
        "type": "shipment.shipped",
        "timestamp": "2026-12-06T10:00:00Z",
        "data": {
            "shipment_id": shipment_id or f"SHP-{uuid.uuid4().hex[:10]}",
            "fulfilment_order_id": f"FO-{order_id.hex[:8]}",
            "reference": str(order_id),
            "shipped_at": "2026-12-06T09:58:00Z",
            "carrier": "DHL",
            "tracking_numbers": ["JD014600003828392019"],
            "tracking_url": "https://track.example/JD014600003828392019",
            "lines": [{"sku": sku, "quantity": quantity} for sku, quantity in lines],
            **data,
        },
    }
    return json.dumps(document).encode()


def cancellation_body(
    order_id: uuid.UUID, lines: list[tuple[str, int]] | None, *, cancellation_id: str | None = None
) -> bytes:
    """A ``fulfilment_order.cancelled`` body (``lines`` None: all the order holds)."""
    data: dict[str, Any] = {
        "cancellation_id": cancellation_id or f"CXL-{uuid.uuid4().hex[:10]}",
        "fulfilment_order_id": f"FO-{order_id.hex[:8]}",
        "reference": str(order_id),
        "cancelled_at": "2026-12-06T09:58:00Z",
        "reason": "unfulfillable",
    }
    if lines is not None:
        data["lines"] = [{"sku": sku, "quantity": quantity} for sku, quantity in lines]
    document = {"type": "fulfilment_order.cancelled", "timestamp": "2026-12-06T10:00:00Z"}
    return json.dumps({**document, "data": data}).encode()


def adjustment_body(
    sku: str, delta: int, reason: str = "damaged", *, adjustment_id: str | None = None
) -> bytes:
    """An ``inventory.adjusted`` body: ``delta`` units of ``sku`` for ``reason``."""
    data = {
        "adjustment_id": adjustment_id or f"ADJ-{uuid.uuid4().hex[:10]}",
        "sku": sku,
        "delta": delta,
        "reason": reason,
        "occurred_at": "2026-12-06T09:55:00Z",
    }
    document = {"type": "inventory.adjusted", "timestamp": "2026-12-06T10:00:00Z"}
    return json.dumps({**document, "data": data}).encode()


def intake_env(database_url: str, **more: str) -> dict[str, str]:
    """The environment of an intake process on ``database_url``, knowing both secrets."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FULFILMENT_")}
    env.update(
        {
            "FULFILMENT_DATABASE_URL": database_url,
            "FULFILMENT_WAREHOUSE_WEBHOOK_SECRETS": f"{SECRET} {SECOND_SECRET}",
            "FULFILMENT_HTTP_HOST": "127.0.0.1",
            "FULFILMENT_LOG_FORMAT": "json",
            **more,
        }
    )
    return env


@dataclass
class IntakeProcess:
    """One ``fulfilment webhooks`` child with its own two ports and log file."""

    env: dict[str, str]
    log_path: Path
    port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The endpoint's URL."""
        return f"http://127.0.0.1:{self.port}{WEBHOOK_PATH}"

    def start(self) -> None:
        """Start it and wait until its endpoint answers (60 s at most)."""
        self.env["FULFILMENT_WEBHOOKS_PORT"] = str(self.port)
        self.env["FULFILMENT_WEBHOOKS_HTTP_PORT"] = str(self.http_port)
        program = str(Path(sys.executable).with_name("fulfilment"))
        with self.log_path.open("ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                [program, "webhooks"], env=self.env, stdout=log, stderr=log
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"intake exited with {self.process.returncode}: {self.log_tail()}")
            if self.serving():
                return
            time.sleep(0.1)
        pytest.fail(f"intake not serving within 60 s: {self.log_tail()}")

    def serving(self) -> bool:
        """Whether the endpoint answers (anything: a GET is 405)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{WEBHOOK_PATH}", timeout=2):
                return True
        except urllib.error.HTTPError:
            return True
        except (urllib.error.URLError, OSError):
            return False

    def metrics(self) -> str:
        """``/metrics`` of the probes' port, as text."""
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.http_port}/metrics", timeout=5
        ) as answer:
            return str(answer.read().decode())

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM; its exit code."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def stop_quietly(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                lines.append(json.loads(line))
        return lines

    def log_tail(self, count: int = 8) -> str:
        return " | ".join(self.log_path.read_text(errors="replace").splitlines()[-count:])


@contextlib.contextmanager
def running_intake(
    database_url: str, log_folder: Path, name: str = "intake", **env: str
) -> Iterator[IntakeProcess]:
    """An intake process on ``database_url`` (more ``env`` beside), killed on exit."""
    process = IntakeProcess(intake_env(database_url, **env), log_folder / f"{name}.log")
    try:
        process.start()
        yield process
    finally:
        process.stop_quietly()
