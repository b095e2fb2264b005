"""Two private PostgreSQL servers in streaming replication, for the failover suite.

``initdb`` makes the first under a temporary folder, ``pg_basebackup -R`` the second, each on a
spare port of 127.0.0.1 and run as the ``postgres`` user (``initdb`` refuses root); the
machine's own server (port 5432) is never touched. Synchronous replication is
``synchronous_standby_names = '*'`` with ``synchronous_commit = on``: a commit returns once the
standby has flushed it. A failover kills the primary (SIGKILL) and promotes the standby
(``pg_ctl promote``); :meth:`PostgresPair.rebuild` makes the old primary a standby of the new one
with ``pg_rewind`` (``wal_log_hints = on``), or a fresh base backup when that fails.

With two servers the promoted one stands alone until the other is rebuilt, so it commits
without waiting meanwhile (``synchronous_standby_names = ''``), as Patroni does without a
synchronous standby; :meth:`PostgresPair.rebuild` sets the wait again once the standby
streams. CloudNativePG's three instances keep a standby through a failover (``k8s/``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from fulfilment.adapters.postgres.engine import asyncpg_dsn
from tests.e2e.harness import free_port

POSTGRES_USER = "postgres"
SYNCHRONOUS = "'*'"
"""``synchronous_standby_names`` of a synchronous pair: any one standby confirms a commit."""
ASYNCHRONOUS = "''"
"""``synchronous_standby_names`` of an asynchronous pair: a commit waits for no standby."""


class PairError(RuntimeError):
    """A server of the pair did not start, promote or rebuild; the message has its log's tail."""


def bindir() -> Path | None:
    """The folder of ``initdb``, ``pg_ctl``, ``pg_basebackup`` and ``pg_rewind``, if installed.

    ``pg_config --bindir`` first; else the newest ``/usr/lib/postgresql/*/bin`` (Debian).
    """
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        found = Path(
            subprocess.run(
                ["pg_config", "--bindir"], capture_output=True, text=True, check=True
            ).stdout.strip()
        )
        if (found / "initdb").exists():
            return found
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3])
    )
    return candidates[-1].parent if candidates else None


def missing_tools() -> list[str]:
    """What the suite needs and the machine lacks (the PostgreSQL server binaries, runuser)."""
    missing = [] if bindir() is not None else ["PostgreSQL server binaries (initdb)"]
    if shutil.which("runuser") is None:
        missing.append("runuser")
    return missing


@dataclass
class Server:
    """One PostgreSQL server of the pair: its data folder, port and log."""

    name: str
    data: Path
    port: int = field(default_factory=free_port)

    @property
    def log(self) -> Path:
        return self.data.parent / f"{self.name}.log"

    def pid(self) -> int | None:
        """The postmaster's process id while ``postmaster.pid`` names a running one."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return pid

    def running(self) -> bool:
        return self.pid() is not None

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{POSTGRES_USER}@127.0.0.1:{self.port}/{database}"


@dataclass
class PostgresPair:
    """A primary and a standby under ``folder``; :attr:`primary` and :attr:`standby` swap on a
    failover. Times in seconds."""

    folder: Path
    replication: str = SYNCHRONOUS
    a: Server = field(init=False)
    b: Server = field(init=False)
    primary: Server = field(init=False)
    standby: Server = field(init=False)
    rebuilt: list[str] = field(default_factory=list)
    """Names of the servers rebuilt as standbys, in turn, and how (``pg_rewind``/base backup)."""
    tools: Path = field(init=False)

    def __post_init__(self) -> None:
        found = bindir()
        if found is None:
            msg = "no PostgreSQL server binaries"
            raise PairError(msg)
        self.tools = found
        self.a = Server("a", self.folder / "a")
        self.b = Server("b", self.folder / "b")
        self.primary, self.standby = self.a, self.b

    # --- commands -------------------------------------------------------------------------

    def _run(self, *args: str, timeout: float = 120) -> str:
        """A server tool as the ``postgres`` user; raises :class:`PairError` with its output."""
        command = ["runuser", "-u", POSTGRES_USER, "--", str(self.tools / args[0]), *args[1:]]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            msg = f"{' '.join(args[:2])} failed ({done.returncode}): {done.stderr or done.stdout}"
            raise PairError(msg)
        return done.stdout

    def _tail(self, server: Server) -> str:
        with contextlib.suppress(OSError):
            return " | ".join(server.log.read_text(errors="replace").splitlines()[-8:])
        return ""

    # --- life cycle -----------------------------------------------------------------------

    def create(self) -> None:
        """``initdb`` the primary, start it, base-back-up the standby from it and start that."""
        self.folder.mkdir(parents=True, exist_ok=True)
        shutil.chown(self.folder, POSTGRES_USER, POSTGRES_USER)
        self._run(
            "initdb", "-D", str(self.a.data), "-U", POSTGRES_USER, "--auth=trust", "-E", "UTF8"
        )
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.folder}'",
            "wal_level": "replica",
            "wal_log_hints": "on",
            "max_wal_senders": "5",
            "wal_keep_size": "'512MB'",
            "hot_standby": "on",
            "synchronous_commit": "on",
            # The suite kills processes, not machines: the page cache outlives a SIGKILL, so
            # what a commit waits for (the standby's flush position) means the same, and the
            # two servers on one disk do not spend the run in fsync.
            "fsync": "off",
            "synchronous_standby_names": self.replication,
            "max_connections": "60",
            "shared_buffers": "'32MB'",
            "logging_collector": "off",
        }
        with (self.a.data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{name} = {value}\n" for name, value in settings.items())
        self.start(self.a)
        self._base_backup(self.b)
        self.start(self.b)
        self.wait_streaming()

    def start(self, server: Server) -> None:
        """Start ``server`` on its port and wait until it accepts connections (60 s)."""
        self._run(
            "pg_ctl", "-D", str(server.data), "-l", str(server.log), "-w", "-t", "60",
            "-o", f"-p {server.port}", "start",
        )  # fmt: skip

    def kill(self, server: Server) -> None:
        """SIGKILL the postmaster of ``server``; its backends end as they notice (at once)."""
        pid = server.pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while server.running() and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self, server: Server, mode: str = "fast") -> None:
        """``pg_ctl stop -m mode``: ``fast`` ends the sessions and ships the last WAL."""
        if server.running():
            self._run("pg_ctl", "-D", str(server.data), "-m", mode, "-w", "stop")

    def promote(self) -> float:
        """Promote the standby and make it the primary; return the seconds it took.

        It stands alone now, so it waits for no standby until :meth:`rebuild`.
        """
        started = time.monotonic()
        self._run("pg_ctl", "-D", str(self.standby.data), "-w", "-t", "30", "promote")
        took = time.monotonic() - started
        self.primary, self.standby = self.standby, self.primary
        self.set_replication(self.primary, ASYNCHRONOUS)
        return took

    def set_replication(self, server: Server, names: str) -> None:
        """``synchronous_standby_names`` of ``server`` (ALTER SYSTEM, then a reload)."""
        self.sql(server, f"ALTER SYSTEM SET synchronous_standby_names = {names}")
        self.sql(server, "SELECT pg_reload_conf()")

    def rebuild(self) -> None:
        """Make the stopped old primary a standby of the primary, and wait until it streams.

        ``pg_rewind`` (it recovers a killed server first, PostgreSQL 13+) takes back what the
        old primary wrote that its successor never received; a fresh base backup replaces it
        if that fails.
        Then the primary waits for it again (:attr:`replication`).
        """
        old = self.standby
        self.stop(old)
        # pg_rewind reads the source's timeline from its control file, which the promoted
        # server updates at its first checkpoint: before it, both look like one timeline and
        # pg_rewind finds nothing to rewind.
        self.sql(self.primary, "CHECKPOINT")
        source = f"host=127.0.0.1 port={self.primary.port} user={POSTGRES_USER} dbname=postgres"
        try:
            self._run(
                "pg_rewind", "-D", str(old.data), "--source-server", source, "-R", timeout=300
            )
            self.rebuilt.append(f"{old.name}: pg_rewind")
        except PairError:
            shutil.rmtree(old.data)
            self._base_backup(old)
            self.rebuilt.append(f"{old.name}: pg_basebackup")
        self.start(old)
        self.wait_streaming()
        self.set_replication(self.primary, self.replication)

    def heal(self) -> None:
        """Both servers running, the standby streaming, the primary waiting as configured."""
        if not self.primary.running():
            self.start(self.primary)
        if not self.standby.running():
            self.rebuild()
        self.set_replication(self.primary, self.replication)
        self.wait_streaming()

    def _base_backup(self, server: Server) -> None:
        self._run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", POSTGRES_USER,
            "-D", str(server.data), "-R", "-X", "stream", "-c", "fast",
        )  # fmt: skip

    def wait_streaming(self, timeout: float = 60) -> None:
        """Wait until the primary has a standby streaming WAL to it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(PairError):
                if self.sql(self.primary, "SELECT count(*) FROM pg_stat_replication"
                            " WHERE state = 'streaming'").strip() == "1":  # fmt: skip
                    return
            time.sleep(0.2)
        msg = f"no standby streams to {self.primary.name}: {self._tail(self.standby)}"
        raise PairError(msg)

    def sql(self, server: Server, statement: str, database: str = "postgres") -> str:
        """Run one statement with ``psql`` on ``server``; its unaligned output."""
        return self._run(
            "psql", "-h", "127.0.0.1", "-p", str(server.port), "-U", POSTGRES_USER,
            "-d", database, "-XAtqc", statement, timeout=30,
        )  # fmt: skip

    def destroy(self) -> None:
        """Stop both servers (immediately) and remove the folder."""
        for server in (self.a, self.b):
            with contextlib.suppress(PairError, subprocess.TimeoutExpired):
                self.stop(server, "immediate")
            self.kill(server)
        shutil.rmtree(self.folder, ignore_errors=True)

    # --- addresses ------------------------------------------------------------------------

    def url(self, database: str) -> str:
        """The service's ``FULFILMENT_DATABASE_URL`` over both servers: whichever is primary."""
        return (
            f"postgresql+asyncpg://{POSTGRES_USER}@/{database}"
            f"?host=127.0.0.1:{self.a.port}&host=127.0.0.1:{self.b.port}"
            "&target_session_attrs=read-write"
        )


async def connect_primary(url: str, timeout: float = 60) -> asyncpg.Connection:
    """A plain asyncpg connection to the primary of the service's URL ``url``, waiting for one."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await asyncpg.connect(asyncpg_dsn(url), timeout=3)
        except (
            OSError,
            asyncpg.PostgresError,
            asyncpg.InterfaceError,
            asyncpg.InternalClientError,
        ):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
