"""A private single-node RabbitMQ with a TLS listener only and definitions loaded at boot.

The node is started as the cluster suite's nodes are (``rabbit_node``: the package's own
scripts, its own name, ports, folder and cookie, never the machine's broker). On two cores it
is up in about 5 s.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import rabbit_node
from tests.support.rabbit_node import RABBITMQ_BIN, spare_port

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
        rabbit_node.prepare(self.folder)
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
        self.process = rabbit_node.launch(
            self.folder, self.folder, self.name, config, dist_port=self.dist_port
        )
        rabbit_node.await_started(
            self.folder,
            self.folder,
            self.name,
            self.process,
            timeout=timeout,
            error=PrivateBrokerError,
        )
        self.started_in = time.monotonic() - began

    def stop(self) -> None:
        """Kill the node (its data goes with the folder) and remove the folder."""
        rabbit_node.kill(self.folder, self.process)
        shutil.rmtree(self.folder, ignore_errors=True)

    def ctl(self, *args: str, timeout: float = 120) -> str:
        """``rabbitmqctl -n <node> ARGS`` with the node's cookie; its standard output.

        Raises:
            PrivateBrokerError: the command failed (its output is in the message).
        """
        return rabbit_node.run(
            self.folder, "rabbitmqctl", self.name, *args, timeout=timeout, error=PrivateBrokerError
        )
