"""Private RabbitMQ nodes of the installed package, for the suites that need a broker of their own.

The cluster suite's three nodes (``tests/cluster/rabbit_cluster.py``) and the TLS suite's
single node (``tests/support/private_broker.py``) start the same way: the package's own scripts, run
directly, with their own node name, spare ports, data, log and configuration under a folder,
an empty plugin list, and an Erlang cookie in a ``HOME`` of their own. Every control command
names the node and uses that ``HOME``, and the machine's ``rabbitmq-env.conf`` is replaced by
an empty file, so the machine's own broker is never touched. Errors are raised as the
caller's own exception class (``error``), which its fixtures catch.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path

RABBITMQ_BIN = Path(os.environ.get("FULFILMENT_TEST_RABBITMQ_BIN", "/usr/lib/rabbitmq/bin"))
"""The package's own scripts, run directly (the ``/usr/sbin`` wrappers would run them as the
``rabbitmq`` user with the machine's broker's cookie)."""


def spare_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on at this moment."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def prepare(folder: Path) -> None:
    """Make ``folder`` hold what every node under it shares: a ``HOME`` with a fresh Erlang
    cookie, an empty ``rabbitmq-env.conf`` and an empty plugin list."""
    home = folder / "home"
    home.mkdir(parents=True)
    cookie = home / ".erlang.cookie"
    cookie.write_text(secrets.token_hex(20).upper())
    cookie.chmod(0o400)
    (folder / "rabbitmq-env.conf").write_text("")
    (folder / "enabled_plugins").write_text("[].\n")


def control_env(folder: Path) -> dict[str, str]:
    """The environment of a control command or node under ``folder`` (see :func:`prepare`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
    env["HOME"] = str(folder / "home")
    # Instead of /etc/rabbitmq/rabbitmq-env.conf, which names the machine's broker.
    env["RABBITMQ_CONF_ENV_FILE"] = str(folder / "rabbitmq-env.conf")
    return env


def launch(
    folder: Path,
    node_folder: Path,
    name: str,
    config: Path,
    *,
    dist_port: int,
    amqp_port: int | None = None,
) -> subprocess.Popen[bytes]:
    """Start node ``name`` with its data, logs, pid file and console log in ``node_folder``.

    ``folder`` is the one :func:`prepare` made; ``amqp_port`` the plain listener's port (None
    when ``config`` sets the listeners). Distribution listens on the loopback only.
    """
    env = {
        **control_env(folder),
        "RABBITMQ_NODENAME": name,
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_DIST_PORT": str(dist_port),
        "RABBITMQ_MNESIA_BASE": str(node_folder / "mnesia"),
        "RABBITMQ_LOG_BASE": str(node_folder / "log"),
        "RABBITMQ_CONFIG_FILE": str(config),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(node_folder / "advanced.config"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(folder / "enabled_plugins"),
        "RABBITMQ_PID_FILE": str(node_folder / "pid"),
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
    }
    if amqp_port is not None:
        env["RABBITMQ_NODE_PORT"] = str(amqp_port)
    (node_folder / "pid").unlink(missing_ok=True)
    with (node_folder / "console.log").open("ab") as console:
        return subprocess.Popen(
            [str(RABBITMQ_BIN / "rabbitmq-server")],
            env=env,
            stdout=console,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C of the test run reaches the node via its stop
        )


def run(
    folder: Path,
    script: str,
    name: str,
    *args: str,
    timeout: float,
    error: type[Exception],
) -> str:
    """``<script> -n <name> ARGS`` (``rabbitmqctl``, ``rabbitmq-queues`` ...); its output.

    Raises:
        error: the command failed or did not answer in ``timeout`` seconds (its output is in
            the message).
    """
    what = f"{script} -n {name} {' '.join(args)}"
    try:
        done = subprocess.run(
            [str(RABBITMQ_BIN / script), "-n", name, *args],
            env=control_env(folder),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as timed_out:
        msg = f"{what}: no answer in {timeout:g} s"
        raise error(msg) from timed_out
    if done.returncode != 0:
        msg = f"{what}: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-1500:]}"
        raise error(msg)
    return done.stdout


def await_started(
    folder: Path,
    node_folder: Path,
    name: str,
    process: subprocess.Popen[bytes],
    *,
    timeout: float,
    error: type[Exception],
) -> None:
    """Wait until node ``name``'s broker application runs (``rabbitmqctl await_startup``).

    Raises:
        error: the node exited, or did not start within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while not (node_folder / "pid").exists():
        if process.poll() is not None:
            msg = f"{name} exited at start: {console_tail(node_folder)}"
            raise error(msg)
        if time.monotonic() > deadline:
            msg = f"{name} did not start in {timeout:g} s"
            raise error(msg)
        time.sleep(0.2)
    run(
        folder,
        "rabbitmqctl",
        name,
        "await_startup",
        "--timeout",
        str(int(timeout)),
        timeout=timeout + 30,
        error=error,
    )


def kill(node_folder: Path, process: subprocess.Popen[bytes] | None) -> None:
    """``kill -9`` the node's Erlang VM (its pid file's), as a crash or an OOM kill does."""
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(OSError, ValueError):
        os.kill(int((node_folder / "pid").read_text().strip()), signal.SIGKILL)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def console_tail(node_folder: Path) -> str:
    """The last lines of the node's console log, on one line."""
    text = (node_folder / "console.log").read_text(errors="replace")
    return " | ".join(text.strip().splitlines()[-8:])
