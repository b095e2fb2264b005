"""A private single-node RabbitMQ with a TLS listener only and definitions loaded at boot.

The node runs the installed ``rabbitmq-server`` package's own scripts (as the cluster suite's
nodes do, ``tests/cluster/rabbit_cluster.py``): its own node name, spare AMQPS and
distribution ports, data, log and configuration under a temporary folder, an empty plugin
list, and an Erlang cookie in a ``HOME`` of its own. Every control command names the node and
uses that ``HOME``, and the machine's ``rabbitmq-env.conf`` is replaced by an empty file, so
the machine's own broker is never touched. On two cores the node is up in about 5 s.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path

RABBITMQ_BIN = Path(os.environ.get("FULFILMENT_TEST_RABBITMQ_BIN", "/usr/lib/rabbitmq/bin"))
"""The package's own scripts, run directly (the ``/usr/sbin`` wrappers would run them as the
``rabbitmq`` user with the machine's broker's cookie)."""

NODE_CONFIG = """\
listeners.tcp = none
listeners.ssl.default = 127.0.0.1:{port}
ssl_options.cacertfile = {ca_file}
ssl_options.certfile = {cert_file}
ssl_options.keyfile = {key_file}
# The clients prove who they are with a password; their certificates are not asked for.
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
load_definitions = {definitions}
log.console = false
log.file.level = info
"""


class PrivateBrokerError(Exception):
    """The node or a control command failed; ``str(error)`` says which and why."""


def spare_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on at this moment."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def missing_tools() -> list[str]:
    """What the node needs that this machine lacks (empty when it can run)."""
    missing = []
    if not (RABBITMQ_BIN / "rabbitmq-server").exists():
        missing.append(f"{RABBITMQ_BIN}/rabbitmq-server (Debian package rabbitmq-server)")
    if shutil.which("openssl") is None:
        missing.append("openssl")
    return missing


@dataclass
class PrivateBroker:
    """One RabbitMQ node under ``folder``, serving AMQPS on 127.0.0.1:``port``.

    ``ca_file``, ``cert_file`` and ``key_file`` are the server's TLS files; ``definitions`` the
    JSON file loaded at boot (users, permissions, virtual hosts, policies).
    """

    folder: Path
    ca_file: Path
    cert_file: Path
    key_file: Path
    definitions: Path
    port: int = field(default_factory=spare_port)
    dist_port: int = field(default_factory=spare_port)
    name: str = field(default_factory=lambda: f"fulfilment-tls-{uuid.uuid4().hex[:8]}@localhost")
    process: subprocess.Popen[bytes] | None = None
    started_in: float = 0.0
    """Seconds :meth:`start` took, from the launch to the broker application running."""

    @property
    def home(self) -> Path:
        return self.folder / "home"

    @property
    def wrong_ca_file(self) -> Path:
        """A CA beside :attr:`ca_file` that did not sign the server's certificate."""
        return self.ca_file.with_name("wrong-ca.crt")

    def url(
        self,
        user: str,
        password: str,
        *,
        host: str = "localhost",
        ca_file: Path | None = None,
    ) -> str:
        """An ``amqps://`` URL of the node's ``/`` virtual host, checked against ``ca_file``
        (:attr:`ca_file` by default) as aiormq reads it (``cafile``)."""
        cafile = urllib.parse.quote(str(ca_file or self.ca_file))
        return f"amqps://{user}:{password}@{host}:{self.port}/?cafile={cafile}"

    def start(self, timeout: float = 90) -> None:
        """Launch the node and wait until its broker application runs.

        Raises:
            PrivateBrokerError: the node exited or did not start within ``timeout`` seconds.
        """
        began = time.monotonic()
        self.home.mkdir(parents=True)
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(20).upper())
        cookie.chmod(0o400)
        (self.folder / "rabbitmq-env.conf").write_text("")
        (self.folder / "enabled_plugins").write_text("[].\n")
        config = self.folder / "rabbitmq.conf"
        config.write_text(
            NODE_CONFIG.format(
                port=self.port,
                ca_file=self.ca_file,
                cert_file=self.cert_file,
                key_file=self.key_file,
                definitions=self.definitions,
            )
        )
        env = {
            **self._control_env(),
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.folder / "log"),
            "RABBITMQ_CONFIG_FILE": str(config),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.folder / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.folder / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.folder / "pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }
        with (self.folder / "console.log").open("ab") as console:
            self.process = subprocess.Popen(
                [str(RABBITMQ_BIN / "rabbitmq-server")],
                env=env,
                stdout=console,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not (self.folder / "pid").exists():
            if self.process.poll() is not None:
                msg = f"{self.name} exited at start: {self._console_tail()}"
                raise PrivateBrokerError(msg)
            if time.monotonic() > deadline:
                msg = f"{self.name} did not start in {timeout:g} s"
                raise PrivateBrokerError(msg)
            time.sleep(0.2)
        self.ctl("await_startup", "--timeout", str(int(timeout)))
        self.started_in = time.monotonic() - began

    def stop(self) -> None:
        """Kill the node (its data goes with the folder) and remove the folder."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                os.kill(int((self.folder / "pid").read_text().strip()), signal.SIGKILL)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)

    def ctl(self, *args: str, timeout: float = 120) -> str:
        """``rabbitmqctl -n <node> ARGS`` with the node's cookie; its standard output.

        Raises:
            PrivateBrokerError: the command failed (its output is in the message).
        """
        what = f"rabbitmqctl {' '.join(args)}"
        try:
            done = subprocess.run(
                [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", self.name, *args],
                env=self._control_env(),
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as error:
            msg = f"{what}: no answer in {timeout:g} s"
            raise PrivateBrokerError(msg) from error
        if done.returncode != 0:
            msg = f"{what}: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-1500:]}"
            raise PrivateBrokerError(msg)
        return done.stdout

    def _control_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env["HOME"] = str(self.home)
        env["RABBITMQ_CONF_ENV_FILE"] = str(self.folder / "rabbitmq-env.conf")
        return env

    def _console_tail(self) -> str:
        text = (self.folder / "console.log").read_text(errors="replace")
        return " | ".join(text.strip().splitlines()[-8:])
