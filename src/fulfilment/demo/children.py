"""The demo's child processes: started with a log file each, waited for, stopped.

The relay, the worker, the dispatcher and the warehouse simulator each run as
``python <arguments>`` with an HTTP server on a free port of its own (whatever else answers
on the configured port is not the demo's) and their output in ``<name>.log`` of
:data:`LOG_DIR`. Each run of the demo replaces those files, so logs do not pile up; the demo
says where they are.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fulfilment.demo.errors import DemoError

LOG_DIR = Path(tempfile.gettempdir()) / "fulfilment-demo"
"""Where the children's logs go (``TMPDIR`` moves it): ``relay.log``, ``worker.log``,
``dispatcher.log``, ``warehouse-simulator.log``, ``webhooks.log`` (the intake), replaced by
each run."""
READY_WAIT_SECONDS = 60.0
"""How long the worker and the relay may take to report ready before the demo gives up."""


@dataclass(frozen=True, slots=True)
class Child:
    """A process the demo started: the worker or the relay, with its HTTP port and log."""

    name: str
    process: asyncio.subprocess.Process
    port: int
    log: Path

    def describe(self) -> str:
        """``pid 123, port 45678, log /tmp/fulfilment-demo/relay.log``."""
        return f"pid {self.process.pid}, port {self.port}, log {self.log}"


async def start_child(
    name: str,
    arguments: Sequence[str],
    port_variable: str | None,
    *,
    env: Mapping[str, str] | None = None,
) -> Child:
    """Start ``python <arguments>`` with its HTTP server on a free port, its output in a log.

    The log is :data:`LOG_DIR`'s ``<name>.log``, emptied first (a log of an earlier run is
    replaced).

    ``port_variable`` is the setting of that port (``FULFILMENT_HTTP_PORT`` ...); None: the
    port is given as ``--port N`` after ``arguments``. A port of its own: whatever else answers
    on the configured one is not this process. ``env`` is added to the demo's environment.
    """
    port = free_port()
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log_path = LOG_DIR / f"{name}.log"
    port_env = {port_variable: str(port)} if port_variable else {}
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *arguments,
            *([] if port_variable else ["--port", str(port)]),
            stdout=log,
            stderr=log,
            env={**os.environ, **(env or {}), **port_env},
        )
    return Child(name, process, port, log_path)


async def wait_ready(child: Child, path: str = "/health/ready") -> None:
    """Wait until ``child`` answers 2xx at ``path`` of its port.

    Raises:
        DemoError: it exited (the message has its log's first error), or did not answer
            within :data:`READY_WAIT_SECONDS` (the message names its log).
    """
    url = f"http://127.0.0.1:{child.port}{path}"
    deadline = time.monotonic() + READY_WAIT_SECONDS
    while time.monotonic() < deadline:
        if child.process.returncode is not None:
            text = await asyncio.to_thread(child.log.read_text, errors="replace")
            msg = (
                f"the {child.name} exited with code {child.process.returncode}:"
                f" {_first_error(text)}"
            )
            raise DemoError(msg)
        if await asyncio.to_thread(_http_ok, url):
            return
        await asyncio.sleep(0.5)
    msg = (
        f"the {child.name} was not ready at {url} within {READY_WAIT_SECONDS:g} s"
        f" (log: {child.log})"
    )
    raise DemoError(msg)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - a fixed http URL on loopback
            return 200 <= int(response.status) < 300  # noqa: PLR2004 - the 2xx range
    except (urllib.error.URLError, OSError):
        return False


async def stop(process: asyncio.subprocess.Process, grace_seconds: float) -> int:
    """SIGTERM ``process``, SIGKILL it after ``grace_seconds``; its exit code (-1 if none)."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(grace_seconds):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()
    return process.returncode if process.returncode is not None else -1


def free_port() -> int:
    """A TCP port free on the loopback now, the kernel's pick.

    Another process may take it before the child binds it: the child then fails to start,
    which the demo says.
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _first_error(log: str) -> str:
    """The first error-level line's reason in a JSON log, else its last line."""
    lines = log.strip().splitlines()
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("level") == "error":
            return str(entry.get("reason") or entry.get("event"))
    return lines[-1] if lines else "(no output)"
