"""The image's steps, read from the Dockerfile and run here, give a worker that works.

There is no Docker engine on the CI machines, so these tests replay what the Dockerfile does:
the build stage's ``uv sync`` commands on a copy of the files it copies, the runtime stage's
copies into a working directory, then the ENTRYPOINT with its CMD. What they prove: the lock
file installs without the source tree (non-editable) and without the demo (``fulfilment demo``
refuses in one line), ``fulfilment migrate`` finds the migrations from the image's working
directory, the HEALTHCHECK command passes, and the worker as PID 1 of its own PID namespace
(as in a container) drains and exits 0 on SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import psutil
import pytest
from sqlalchemy.engine import make_url

from fulfilment.entrypoints.cli.demo import DEMO_NOT_INSTALLED
from fulfilment.exit_codes import ExitCode
from tests.deploy.stack import (
    ROOT,
    Stack,
    dockerfile_env,
    dockerfile_stages,
    instructions,
    load_stack,
)
from tests.e2e.harness import free_port
from tests.support.services import ADMIN_DATABASE_URL, service_unavailable

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq, pytest.mark.e2e]


@dataclass(frozen=True)
class Image:
    """The replayed image: its environment's bin folder, working directory and runtime ENV."""

    bin: Path
    workdir: Path
    env: dict[str, str]
    entrypoint: list[str]
    cmd: list[str]
    healthcheck: list[str]

    def environment(self, **settings: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FULFILMENT_")}
        env.update({k: v for k, v in self.env.items() if k != "PATH"})
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env.update(settings)
        return env

    def command(self, *args: str) -> list[str]:
        return [str(self.bin / self.entrypoint[0]), *self.entrypoint[1:], *args]


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        shutil.copy2(source, target)


def _replay_copies(stage: list[dict[str, str]], into: Path) -> None:
    for value in instructions(stage, "COPY"):
        parts = shlex.split(value)
        if parts[0].startswith("--from"):
            continue  # the environment, which the replay builds in place
        *sources, destination = parts
        for source in sources:
            target = into / destination
            if destination.endswith("/"):
                target = target / Path(source).name
            _copy(ROOT / source, target)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    stack: Stack = load_stack()
    build, runtime = dockerfile_stages(stack)[0], dockerfile_stages(stack)[-1]
    root = tmp_path_factory.mktemp("image")
    source, workdir, venv = root / "src", root / "app", root / "venv"
    _replay_copies(build, source)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "VIRTUAL_ENV"))}
    env.update(dockerfile_env(build))
    env["UV_PROJECT_ENVIRONMENT"] = str(venv)
    # Here the uv cache makes the replay fast; the image build itself runs without one.
    env.pop("UV_NO_CACHE", None)
    # `uv run` names its own executable in UV; a developer may have uv on the PATH only.
    uv = os.environ.get("UV") or shutil.which("uv")
    assert uv, "uv is not on the PATH"
    for run in instructions(build, "RUN"):
        if run.startswith("uv "):
            command = [uv, *shlex.split(run)[1:]]
            subprocess.run(command, cwd=source, env=env, check=True, timeout=300)
    _replay_copies(runtime, workdir)
    healthcheck = instructions(runtime, "HEALTHCHECK")[0]
    return Image(
        bin=venv / "bin",
        workdir=workdir,
        env=dockerfile_env(runtime),
        entrypoint=json.loads(instructions(runtime, "ENTRYPOINT")[0]),
        cmd=json.loads(instructions(runtime, "CMD")[0]),
        healthcheck=json.loads(healthcheck[healthcheck.index("CMD ") + 4 :]),
    )


async def _admin(sql: str) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(ADMIN_DATABASE_URL, timeout=5)
    try:
        return await connection.fetch(sql)
    finally:
        await connection.close()


async def _alembic_version(url: str) -> str:
    connection = await asyncpg.connect(
        make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    )
    try:
        return str(await connection.fetchval("SELECT version_num FROM alembic_version"))
    finally:
        await connection.close()


@pytest.fixture
def empty_database_url(database_url: str) -> Iterator[str]:
    """A database name that does not exist yet (``fulfilment migrate`` creates it)."""
    name = f"fulfilment_image_{uuid.uuid4().hex[:12]}"
    yield make_url(database_url).set(database=name).render_as_string(hide_password=False)
    asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def test_the_image_migrates_a_new_database_from_its_working_directory(
    image: Image, empty_database_url: str, database_url: str
) -> None:
    result = subprocess.run(
        image.command("migrate"),
        cwd=image.workdir,
        env=image.environment(FULFILMENT_DATABASE_URL=empty_database_url),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert asyncio.run(_alembic_version(empty_database_url)) == asyncio.run(
        _alembic_version(database_url)
    )
    # Installed from the lock file as a regular package: nothing is read from the checkout.
    package = subprocess.run(
        [str(image.bin / "python"), "-c", "import fulfilment; print(fulfilment.__file__)"],
        cwd=image.workdir,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert not package.startswith(str(ROOT))


def test_the_image_carries_the_sql_statements_its_adapters_load_at_import(image: Image) -> None:
    # The dispatcher's store reads its statements from package files (adapters/postgres/sql)
    # when it is imported: a wheel without them would fail the dispatcher at start.
    result = subprocess.run(
        [
            str(image.bin / "python"),
            "-c",
            "import fulfilment.adapters.postgres.warehouse_requests as m; print(m.__file__)",
        ],
        cwd=image.workdir,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert not result.stdout.startswith(str(ROOT))


def test_the_image_leaves_the_demo_out_and_fulfilment_demo_says_so_in_one_line(
    image: Image,
) -> None:
    # ``demo --reset`` truncates the service's tables: the production wheel does not carry it.
    result = subprocess.run(
        image.command("demo", "--reset"),
        cwd=image.workdir,
        env=image.environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == ExitCode.BAD_INPUT, result.stderr
    assert result.stderr.splitlines() == [f"fulfilment: {DEMO_NOT_INSTALLED}"]
    assert result.stdout == ""
    found = subprocess.run(
        [
            str(image.bin / "python"),
            "-c",
            (
                "import importlib.util as u; print(u.find_spec('fulfilment.demo'),"
                " u.find_spec('fulfilment.dataset.publish') is None)"
            ),
        ],
        cwd=image.workdir,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    # The data set's commands (publish, reconcile, stock plan) stay: they are the product's.
    assert found == ["None", "False"]


def _get(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, OSError):
        return 0


def _pid_namespaces_available() -> None:
    try:
        subprocess.run(
            ["unshare", "--pid", "--fork", "--kill-child", "true"],
            check=True,
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError) as error:
        service_unavailable("unshare --pid (a PID namespace, as root)", error)


def test_the_worker_as_pid_1_passes_its_healthcheck_then_drains_and_exits_0_on_sigterm(
    image: Image, amqp_url: str, database_url: str, tmp_path: Path
) -> None:
    _pid_namespaces_available()
    port = free_port()
    env = image.environment(
        FULFILMENT_AMQP_URL=amqp_url,
        FULFILMENT_DATABASE_URL=database_url,
        FULFILMENT_HTTP_PORT=str(port),
    )
    log = tmp_path / "worker.log"
    with log.open("wb") as output:
        # --fork: the command is PID 1 of a new PID namespace, as the ENTRYPOINT is in a container.
        outer = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--kill-child", *image.command(*image.cmd)],
            cwd=image.workdir,
            env=env,
            stdout=output,
            stderr=output,
        )
    try:
        deadline = time.monotonic() + 60
        while _get(port, "/health/ready") != 200:
            assert outer.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        health = subprocess.run(
            [str(image.bin / image.healthcheck[0]), *image.healthcheck[1:]],
            env=env,
            capture_output=True,
            timeout=10,
            check=False,
        )
        assert health.returncode == 0, health.stderr

        (worker,) = psutil.Process(outer.pid).children()
        # The console script runs in the interpreter: python <bin>/fulfilment worker.
        assert Path(worker.cmdline()[1]).name == image.entrypoint[0]
        assert worker.cmdline()[2:] == image.cmd
        status = Path(f"/proc/{worker.pid}/status").read_text()
        assert (
            status.split("NSpid:")[1].splitlines()[0].split()[-1] == "1"
        )  # PID 1 in its namespace
        os.kill(worker.pid, signal.SIGTERM)
        code = outer.wait(timeout=30)
    finally:
        if outer.poll() is None:
            outer.kill()
            outer.wait()
    assert code == 0, log.read_text()
    assert "worker.stopped" in log.read_text()


def test_the_pid_namespace_replay_sees_a_non_zero_exit(image: Image) -> None:
    """The start-up failure path, so the exit code above is the worker's own: bad settings
    exit 2 before anything connects."""
    _pid_namespaces_available()
    result = subprocess.run(
        ["unshare", "--pid", "--fork", "--kill-child", *image.command(*image.cmd)],
        cwd=image.workdir,
        env=image.environment(FULFILMENT_HANDLER_DEADLINE_SECONDS="60"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "FULFILMENT_HANDLER_DEADLINE_SECONDS" in result.stderr
