"""A private three-node RabbitMQ cluster for tests, behind one address, in a folder of its own.

The nodes run the installed ``rabbitmq-server`` package (Debian's, 3.10 here) as the current
user, each with its own node name (``fulfilment-test-<n>@localhost``), AMQP and distribution
ports (spare ones, found at start), data and log folders, configuration file and an empty
plugin list; the three share an Erlang cookie of their own, kept in a ``HOME`` of the cluster's
own (RabbitMQ 3.10 reads the cookie from ``$HOME/.erlang.cookie`` only: no file of the package
reads ``RABBITMQ_ERLANG_COOKIE``). Nodes 2 and 3 join node 1 with ``rabbitmqctl join_cluster``.
HAProxy, from Debian's packages, runs as a private instance with its own configuration file on
a spare port and puts one address in front of the three, as a Kubernetes Service does: each
connection goes to a node picked at random among those that accept connections, and
established connections are left alone when a node stops answering (kube-proxy does the same).

The machine's own broker is never touched: every control command is the package's own
script (``/usr/lib/rabbitmq/bin``; the ``/usr/sbin`` wrappers would run it as the
``rabbitmq`` user with that broker's cookie), runs with the cluster's ``HOME`` and names its
node with ``-n``, and the environment file of the machine's broker is replaced by an empty one.

Run as a script, it starts a cluster, prints its addresses and keeps it up until Ctrl-C
(``make rabbitmq-cluster``); the tests use it through the ``rabbit_cluster`` fixture
(``tests/cluster/conftest.py``). On two cores the three nodes are up, joined and behind the
proxy in about 16 s (``started_in``).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a script too (``make rabbitmq-cluster``), where pytest's pythonpath does not apply.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support import rabbit_node
from tests.support.rabbit_node import RABBITMQ_BIN, spare_port

NODE_NAME = "fulfilment-test-{index}@localhost"

NODE_CONFIG = """\
listeners.tcp.1 = 127.0.0.1:{amqp_port}
# The same partition handling as the Cluster Operator's generated configuration (and
# deploy/rabbitmq/rabbitmq.conf): a node that finds itself in a minority pauses.
cluster_partition_handling = pause_minority
log.console = false
log.file.level = info
"""

HAPROXY_CONFIG = """\
global
    maxconn 4096
    pidfile {folder}/haproxy.pid

defaults
    mode tcp
    timeout connect 2s
    # AMQP connections live for hours; kube-proxy has no idle timeout either.
    timeout client 3h
    timeout server 3h
    # A connection to a node that refuses is tried once more on another node.
    retries 1
    option redispatch

frontend amqp
    bind 127.0.0.1:{port}
    default_backend nodes

backend nodes
    # A node picked at random for each connection, as kube-proxy's iptables rules do.
    balance random
{servers}
"""

HAPROXY_SERVER = "    server node{index} 127.0.0.1:{port} check inter 1s fall 2 rise 1"


class ClusterError(Exception):
    """A node, a control command or the proxy failed; ``str(error)`` says which and why."""


def answers(port: int) -> bool:
    """Whether something accepts TCP connections on ``127.0.0.1:port``."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


@dataclass
class Node:
    """One RabbitMQ node of the cluster."""

    index: int
    folder: Path
    amqp_port: int = field(default_factory=spare_port)
    dist_port: int = field(default_factory=spare_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return NODE_NAME.format(index=self.index)

    @property
    def pid_file(self) -> Path:
        return self.folder / "pid"

    def beam_pid(self) -> int:
        """The operating-system process of the node's Erlang VM (``RABBITMQ_PID_FILE``)."""
        return int(self.pid_file.read_text().strip())

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class RabbitCluster:
    """Three RabbitMQ nodes and an HAProxy in front, all under ``folder``.

    :meth:`start` brings everything up; :meth:`stop` stops it and removes ``folder``.
    """

    folder: Path
    size: int = 3
    proxy_port: int = field(default_factory=spare_port)
    nodes: list[Node] = field(default_factory=list)
    proxy: subprocess.Popen[bytes] | None = None
    started_in: float = 0.0
    """Seconds :meth:`start` took, from the first node's launch to the proxy answering."""

    def __post_init__(self) -> None:
        self.home = self.folder / "home"
        if not self.nodes:
            self.nodes = [Node(i, self.folder / f"node-{i}") for i in range(1, self.size + 1)]

    # --- addresses ----------------------------------------------------------------------

    def amqp_url(self, vhost: str = "/") -> str:
        """The URL of the cluster's one address (the proxy), for ``vhost``."""
        return (
            f"amqp://guest:guest@127.0.0.1:{self.proxy_port}/{urllib.parse.quote(vhost, safe='')}"
        )

    def node_url(self, node: Node, vhost: str = "/") -> str:
        """The URL of one node, bypassing the proxy."""
        return f"amqp://guest:guest@127.0.0.1:{node.amqp_port}/{urllib.parse.quote(vhost, safe='')}"

    def node(self, name: str) -> Node:
        """The node called ``name`` (``fulfilment-test-2@localhost``)."""
        return next(node for node in self.nodes if node.name == name)

    # --- life cycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the nodes side by side, cluster them, then start the proxy.

        Raises:
            ClusterError: a node did not start or join, or the proxy did not answer.
        """
        began = time.monotonic()
        rabbit_node.prepare(self.folder)
        for node in self.nodes:
            self.start_node(node, wait=False)
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(self.await_node, self.nodes))
        seed = self.nodes[0]
        for node in self.nodes[1:]:
            self.ctl(node, "stop_app")
            self.ctl(node, "join_cluster", seed.name)
            self.ctl(node, "start_app")
        self.start_proxy()
        self.started_in = time.monotonic() - began

    def stop(self) -> None:
        """Stop the proxy and every node (killed: the data goes too), and remove the folder."""
        self.stop_proxy()
        for node in self.nodes:
            self.kill(node)
        shutil.rmtree(self.folder, ignore_errors=True)

    def start_node(self, node: Node, *, wait: bool = True) -> None:
        """Launch ``node`` (first start, or again after :meth:`kill` or :meth:`stop_node`)."""
        node.folder.mkdir(parents=True, exist_ok=True)
        config = node.folder / "rabbitmq.conf"
        config.write_text(NODE_CONFIG.format(amqp_port=node.amqp_port))
        node.process = rabbit_node.launch(
            self.folder,
            node.folder,
            node.name,
            config,
            dist_port=node.dist_port,
            amqp_port=node.amqp_port,
        )
        if wait:
            self.await_node(node)

    def await_node(self, node: Node, timeout: float = 90) -> None:
        """Wait until ``node``'s broker application runs (``rabbitmqctl await_startup``)."""
        assert node.process is not None
        rabbit_node.await_started(
            self.folder, node.folder, node.name, node.process, timeout=timeout, error=ClusterError
        )

    def kill(self, node: Node) -> None:
        """``kill -9`` the node's Erlang VM, as a crash or an OOM kill does."""
        rabbit_node.kill(node.folder, node.process)

    def stop_node(self, node: Node) -> None:
        """Stop ``node`` gracefully (``rabbitmqctl stop``), as an upgrade's restart does."""
        self.ctl(node, "stop")
        assert node.process is not None
        node.process.wait(timeout=60)

    def cut_off(self, node: Node) -> None:
        """Cut ``node``'s links to its peers while it keeps running and serving its clients.

        The node is told a wrong cookie for each peer and drops its connections to them, so
        every reconnection fails the distribution handshake, both ways: its peers see it go
        down, it sees them go down, as with a blocked distribution port (no firewall needed).
        """
        peers = self._peer_list(node)
        self.ctl(
            node,
            "eval",
            f"[begin erlang:set_cookie(N, fulfilment_cut_off), erlang:disconnect_node(N) end"
            f" || N <- {peers}], ok.",
        )

    def reconnect(self, node: Node) -> None:
        """Undo :meth:`cut_off`: the node's own cookie for its peers again, and a ping each."""
        peers = self._peer_list(node)
        self.ctl(
            node,
            "eval",
            f"[begin erlang:set_cookie(N, erlang:get_cookie()), net_adm:ping(N) end"
            f" || N <- {peers}], ok.",
        )

    def _peer_list(self, node: Node) -> str:
        return "[" + ", ".join(f"'{peer.name}'" for peer in self.nodes if peer is not node) + "]"

    # --- the proxy ----------------------------------------------------------------------

    def start_proxy(self) -> None:
        """Start HAProxy on :attr:`proxy_port` and wait until it accepts connections."""
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        config = self.folder / "haproxy.cfg"
        servers = "\n".join(
            HAPROXY_SERVER.format(index=node.index, port=node.amqp_port) for node in self.nodes
        )
        config.write_text(
            HAPROXY_CONFIG.format(folder=self.folder, port=self.proxy_port, servers=servers)
        )
        with (self.folder / "haproxy.log").open("ab") as log:
            self.proxy = subprocess.Popen(
                [haproxy, "-db", "-f", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + 10
        while not answers(self.proxy_port):
            if self.proxy.poll() is not None or time.monotonic() > deadline:
                log_text = (self.folder / "haproxy.log").read_text(errors="replace")
                msg = f"HAProxy did not start: {log_text[-1000:]}"
                raise ClusterError(msg)
            time.sleep(0.05)

    def stop_proxy(self) -> None:
        """Stop HAProxy at once: every connection through it drops."""
        if self.proxy is not None and self.proxy.poll() is None:
            self.proxy.kill()
            self.proxy.wait(timeout=10)
        self.proxy = None

    def restart_proxy(self) -> None:
        """Kill HAProxy and start it again on the same port."""
        self.stop_proxy()
        self.start_proxy()

    # --- control commands ---------------------------------------------------------------

    def ctl(self, node: Node, *args: str, timeout: float = 120) -> str:
        """``rabbitmqctl -n <node> ARGS`` with the cluster's cookie; its standard output.

        Raises:
            ClusterError: the command failed (its output is in the message).
        """
        return self._run("rabbitmqctl", node, *args, timeout=timeout)

    def queues(self, node: Node, *args: str, timeout: float = 60) -> str:
        """``rabbitmq-queues -n <node> ARGS`` with the cluster's cookie; its standard output."""
        return self._run("rabbitmq-queues", node, *args, timeout=timeout)

    def running_nodes(self) -> list[Node]:
        """The nodes whose VM runs."""
        return [node for node in self.nodes if node.running()]

    def upgrade(self, node: Node, *args: str, timeout: float = 180) -> str:
        """``rabbitmq-upgrade -n <node> ARGS`` with the cluster's cookie; its standard output."""
        return self._run("rabbitmq-upgrade", node, *args, timeout=timeout)

    def queue_info(self, queue: str, vhost: str = "/") -> dict[str, Any]:
        """``leader``, ``members``, ``online`` and ``arguments`` (name -> value) of ``queue``,
        as the broker says (asked of the first node that runs).

        Raises:
            ClusterError: no node answered, or there is no such queue.
        """
        rows = json.loads(
            self.ctl(
                self.running_nodes()[0],
                *("-q", "list_queues", "-p", vhost, "--formatter", "json"),
                *("name", "leader", "members", "online", "arguments"),
            )
        )
        for row in rows:
            if row["name"] == queue:
                # [[name, AMQP type, value], ...] in the JSON of rabbitmqctl 3.10
                arguments = {name: value for name, _, value in row["arguments"]}
                return {**row, "arguments": arguments}
        msg = f"queue {queue!r} not found on the cluster"
        raise ClusterError(msg)

    def leader(self, queue: str, vhost: str = "/") -> Node:
        """The node that leads quorum queue ``queue`` now.

        Raises:
            ClusterError: the queue has no leader on a node of the cluster now.
        """
        leader = self.queue_info(queue, vhost).get("leader")
        for node in self.nodes:
            if node.name == leader:
                return node
        msg = f"queue {queue!r} has no leader now ({leader!r})"
        raise ClusterError(msg)

    def consumer_nodes(self, queue: str, vhost: str = "/") -> list[str]:
        """For each consumer of ``queue``, the node its channel lives on (where its client
        is connected), as the broker says."""
        rows = self.ctl(
            self.running_nodes()[0],
            *("-q", "list_consumers", "-p", vhost, "--no-table-headers"),
            *("queue_name", "channel_pid"),
        )
        # The table shows a channel's pid as <fulfilment-test-2@localhost.1665.1234.0> (the
        # JSON formatter drops the node).
        return sorted(
            pid.strip().strip("<>").rsplit(".", 3)[0]
            for name, _, pid in (row.partition("\t") for row in rows.splitlines())
            if name == queue
        )

    def partitions(self) -> list[str]:
        """The nodes that see a partition, as the first running node's cluster status says."""
        status = json.loads(
            self.ctl(self.running_nodes()[0], "-q", "cluster_status", "--formatter", "json")
        )
        return sorted(status.get("partitions") or {})

    def _run(self, script: str, node: Node, *args: str, timeout: float) -> str:
        return rabbit_node.run(
            self.folder, script, node.name, *args, timeout=timeout, error=ClusterError
        )


def missing_tools() -> list[str]:
    """What the harness needs that this machine lacks (empty when it can run)."""
    missing = []
    if not (RABBITMQ_BIN / "rabbitmq-server").exists():
        missing.append(f"{RABBITMQ_BIN}/rabbitmq-server (Debian package rabbitmq-server)")
    if shutil.which("haproxy") is None and not Path("/usr/sbin/haproxy").exists():
        missing.append("haproxy (Debian package haproxy)")
    return missing


def main() -> int:
    """Start a cluster, print its addresses, and keep it up until Ctrl-C."""
    missing = missing_tools()
    if missing:
        sys.stderr.write(f"missing: {', '.join(missing)}\n")
        return 1
    cluster = RabbitCluster(Path(tempfile.mkdtemp(prefix="fulfilment-cluster-")))
    try:
        cluster.start()
        sys.stdout.write(
            f"cluster up in {cluster.started_in:.1f} s; one address: {cluster.amqp_url()}\n"
        )
        for node in cluster.nodes:
            sys.stdout.write(
                f"  {node.name}: {cluster.node_url(node)} (distribution port {node.dist_port})\n"
            )
        sys.stdout.write(
            f"control: HOME={cluster.home} RABBITMQ_CONF_ENV_FILE="
            f"{cluster.folder / 'rabbitmq-env.conf'} {RABBITMQ_BIN}/rabbitmqctl -n "
            f"{cluster.nodes[0].name} cluster_status\nCtrl-C stops it and removes "
            f"{cluster.folder}\n"
        )
        sys.stdout.flush()
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
