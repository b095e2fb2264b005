"""The command line as the tools' root: its commands, its one-line failures and exit codes."""

from __future__ import annotations

import asyncio
import importlib.abc
import inspect
import itertools
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from pydantic import SecretStr
from typer.testing import CliRunner

from fulfilment import __version__
from fulfilment.entrypoints.cli import app
from fulfilment.entrypoints.cli.demo import DEMO_NOT_INSTALLED
from fulfilment.entrypoints.cli.exits import run
from fulfilment.entrypoints.cli.options import tool_options
from fulfilment.routes.table import DEAD_LETTER_QUEUES
from fulfilment.settings import BrokerSettings, DatabaseSettings, Settings
from fulfilment.tools.dead_letters import dead_letter_queues

SAMPLE = Path(__file__).parents[2] / "data" / "sample"
NOWHERE_DATABASE = "postgresql://postgres:secret@127.0.0.1:1/nowhere"
NOWHERE_BROKER = "amqp://guest:secret@127.0.0.1:1/"


@pytest.fixture(autouse=True)
def no_environment(monkeypatch):
    for name in ("FULFILMENT_DATABASE_URL", "FULFILMENT_AMQP_URL", "FULFILMENT_PREFETCH_COUNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir("/")  # no .env file


def fulfilment(*args: str, **env: str):
    return CliRunner().invoke(app, list(args), env=env)


def test_the_help_lists_every_command():
    result = fulfilment("--help")

    assert result.exit_code == 0
    for command in ("worker", "migrate", "stock", "publish", "report", "reconcile", "demo", "dlq"):
        assert f" {command} " in result.stdout


COMMANDS = [
    [],
    ["worker"],
    ["migrate"],
    ["stock"],
    ["stock", "load"],
    ["stock", "plan"],
    ["publish"],
    ["report"],
    ["reconcile"],
    ["demo"],
    ["dlq"],
    ["dlq", "list"],
    ["dlq", "show"],
    ["dlq", "replay"],
    ["dlq", "purge"],
]


def description(help_text: str) -> list[str]:
    """The lines of a help page between its usage line and its first panel."""
    lines = help_text.splitlines()
    start = next(i for i, line in enumerate(lines) if "Usage:" in line) + 1
    end = next((i for i, line in enumerate(lines) if line.startswith("╭")), len(lines))
    return [line.strip() for line in lines[start:end]]


def test_the_version_is_printed_with_exit_0():
    result = fulfilment("--version")

    assert result.exit_code == 0
    assert result.stdout == f"fulfilment {__version__}\n"


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_shows_no_markup_and_no_type_after_a_flag(command):
    result = fulfilment(*command, "--help")

    assert result.exit_code == 0
    assert "``" not in result.stdout
    assert "<bool>" not in result.stdout


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_paragraphs_are_filled_to_the_width_not_broken_where_the_docstring_was(command):
    page = fulfilment(*command, "--help").stdout
    width = max(len(line) for line in page.splitlines())  # the panels span the terminal
    lines = description(page)

    # A line followed by more text of its paragraph is a full one (the width, less a word).
    short = [
        line
        for line, following in itertools.pairwise(lines)
        if line and following and len(line) < 0.6 * width
    ]
    assert short == []


def every_command() -> list[list[str]]:
    """The path of every command and group of ``fulfilment``, from the typer app itself."""

    def walk(command, path):
        yield path
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])

    return list(walk(typer.main.get_command(app), []))


@pytest.mark.parametrize("command", every_command(), ids=" ".join)
def test_usage_lines_name_arguments_in_capitals_without_python_types(command):
    page = fulfilment(*command, "--help").stdout
    usage = next(line for line in page.splitlines() if "Usage:" in line)

    assert "{" not in usage
    assert not any(word.islower() for word in usage.split()[2 + len(command) :])
    assert "<list[" not in page


@pytest.mark.parametrize(
    ("command", "usage"),
    [
        (["publish"], "Missing argument 'FILE...'; usage: fulfilment publish [OPTIONS] FILE..."),
        (["stock", "load"], "Missing argument 'FILE'; usage: fulfilment stock load [OPTIONS] FILE"),
        (["nonsense"], "No such command 'nonsense'; usage: fulfilment [OPTIONS] COMMAND [ARGS]..."),
        (["--nonsense"], "No such option: --nonsense; usage: fulfilment [OPTIONS] COMMAND"),
        (["dlq", "show", "--limit", "x"], "Invalid value for '--limit'"),
        (["dlq", "nonsense"], "No such command 'nonsense'; usage: fulfilment dlq [OPTIONS]"),
    ],
    ids=lambda part: " ".join(part) if isinstance(part, list) else "",
)
def test_a_usage_error_is_one_line_and_exits_2(command, usage):
    result = fulfilment(*command)

    assert result.exit_code == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"fulfilment: {usage}")


def test_each_prune_command_says_what_the_other_one_does():
    prune = " ".join(fulfilment("prune", "--help", COLUMNS="200").stdout.split())
    outbox_prune = " ".join(fulfilment("outbox", "prune", "--help", COLUMNS="200").stdout.split())

    assert "fulfilment outbox prune does its outbox part alone" in prune
    assert "The outbox part of fulfilment prune, leaving the inbox as it is" in outbox_prune


@pytest.mark.parametrize("group", [[], ["stock"], ["dlq"]], ids=lambda g: " ".join(g) or "-")
def test_a_group_called_alone_prints_its_help_and_exits_2(group):
    result = fulfilment(*group)

    assert result.exit_code == 2
    assert f"Usage: fulfilment {' '.join([*group, ''])}[OPTIONS] COMMAND [ARGS]..." in result.stdout
    assert "Commands" in result.stdout
    assert result.stderr == ""


def test_stock_plan_writes_the_shipped_plan_of_the_sample(tmp_path):
    out = tmp_path / "stock.csv"

    result = fulfilment("stock", "plan", str(SAMPLE / "online-retail"), "--out", str(out))

    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"planned 1368 stock levels for 170 orders into {out}\n"
    assert out.read_bytes() == (SAMPLE / "stock.csv").read_bytes()


def test_a_missing_data_folder_is_bad_input_said_in_one_line(tmp_path):
    result = fulfilment("stock", "plan", "/nonexistent", "--out", str(tmp_path / "stock.csv"))

    assert result.exit_code == 2
    assert result.stderr == "fulfilment: /nonexistent: no such file or folder\n"


def test_invalid_settings_are_bad_input_naming_the_variable():
    result = fulfilment("report", FULFILMENT_PREFETCH_COUNT="0")

    assert result.exit_code == 2
    assert result.stderr == (
        "fulfilment: invalid settings: FULFILMENT_PREFETCH_COUNT:"
        " Input should be greater than or equal to 1\n"
    )


def test_a_dead_letter_command_without_a_selection_is_bad_input():
    result = fulfilment("dlq", "replay")

    assert result.exit_code == 2
    assert result.stderr == (
        "fulfilment: choose the dead letters with exactly one of --id, --group or --all\n"
    )


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("", "not a dead letter's id: ''"),
        ("one two", "not a dead letter's id: 'one two'"),
        ("x" * 256, "at most 255 bytes"),
        (
            "permanent/MalformedEventError",
            "is a group, not an id: choose it with --group permanent/MalformedEventError",
        ),
    ],
    ids=["empty", "two words", "too long", "a group"],
)
@pytest.mark.parametrize("command", ["show", "replay", "purge"])
def test_a_dead_letter_id_that_no_dead_letter_can_have_is_bad_input(command, value, said):
    result = fulfilment("dlq", command, "--id", value, FULFILMENT_AMQP_URL=NOWHERE_BROKER)

    assert result.exit_code == 2
    assert result.stderr.startswith("fulfilment: Invalid value for '--id': ")
    assert said in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_a_dead_letter_queue_the_topology_does_not_have_is_bad_input():
    result = fulfilment("dlq", "list", "--queue", "fulfilment.nope")

    assert result.exit_code == 2
    assert result.stderr == (
        "fulfilment: no dead-letter queue fulfilment.nope; the dead-letter queues are "
        f"{', '.join(DEAD_LETTER_QUEUES)}\n"
    )
    assert DEAD_LETTER_QUEUES[:3] == (
        "fulfilment.order-placed.dlq",
        "fulfilment.order-cancelled.dlq",
        "fulfilment.order-shipped.dlq",
    )


def test_a_dead_letter_queue_is_chosen_by_its_name_or_its_queue_s():
    assert dead_letter_queues([]) == DEAD_LETTER_QUEUES
    assert dead_letter_queues(["fulfilment.order-shipped.dlq", "fulfilment.order-placed"]) == (
        "fulfilment.order-placed.dlq",
        "fulfilment.order-shipped.dlq",
    )


def test_an_unreachable_database_exits_3_without_its_password():
    result = fulfilment(
        "stock", "load", str(SAMPLE / "stock.csv"), FULFILMENT_DATABASE_URL=NOWHERE_DATABASE
    )

    assert result.exit_code == 3
    assert result.stderr.startswith(
        "fulfilment: PostgreSQL at postgresql+asyncpg://postgres:***@127.0.0.1:1/nowhere"
        " is not reachable: "
    )
    assert result.stderr.count("\n") == 1


# report's engine is given FULFILMENT_DATABASE_CONNECT_TIMEOUT_SECONDS; migrate's first
# connection (does the database exist?) its own 5 s (adapters.postgres.admin.CONNECT_SECONDS).
@pytest.mark.parametrize(("command", "seconds"), [("report", "0.5"), ("migrate", "5")])
def test_a_database_that_never_answers_exits_3_saying_how_long_it_was_given(command, seconds):
    with socket.create_server(("127.0.0.1", 0)) as silent:  # listens, never answers
        port = silent.getsockname()[1]
        result = fulfilment(
            command,
            FULFILMENT_DATABASE_URL=f"postgresql://postgres@127.0.0.1:{port}/nowhere",
            FULFILMENT_DATABASE_CONNECT_TIMEOUT_SECONDS="0.5",
        )

    assert result.exit_code == 3
    assert result.stderr == (
        f"fulfilment: PostgreSQL at postgresql+asyncpg://postgres@127.0.0.1:{port}/nowhere is"
        f" not reachable: opening a connection got no answer within {seconds} s\n"
    )


def test_a_missing_stock_file_is_named_with_what_went_wrong_and_exits_2():
    missing = "data/sample/no-such-stock.csv"

    result = fulfilment("stock", "load", missing, FULFILMENT_DATABASE_URL=NOWHERE_DATABASE)

    assert result.exit_code == 2
    assert result.stderr == (
        f"fulfilment: {missing}: cannot read the stock file: No such file or directory\n"
    )


def test_an_unreachable_broker_exits_3_without_its_password():
    result = fulfilment("dlq", "list", FULFILMENT_AMQP_URL=NOWHERE_BROKER)

    assert result.exit_code == 3
    assert result.stderr.startswith(
        "fulfilment: RabbitMQ at amqp://guest:***@127.0.0.1:1/ is not reachable: "
    )
    assert result.stderr.count("\n") == 1


def test_the_options_built_for_the_tools_keep_the_urls_out_of_their_repr():
    options = tool_options(
        Settings(
            database=DatabaseSettings(url=SecretStr(NOWHERE_DATABASE)),
            broker=BrokerSettings(amqp_url=SecretStr(NOWHERE_BROKER)),
        )
    )

    assert options.database.url == "postgresql+asyncpg://postgres:secret@127.0.0.1:1/nowhere"
    assert options.amqp_url == NOWHERE_BROKER
    assert "secret" not in repr(options)


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (
            "FULFILMENT_DATABASE_URI=postgresql://elsewhere/fulfilment",
            (
                ".env:1: FULFILMENT_DATABASE_URI: not a setting of this service (did you mean"
                " FULFILMENT_DATABASE_URL?)"
            ),
        ),
        (
            'FULFILMENT_DATABASE_URL="postgresql://postgres@db/elsewhere',
            (
                ".env:1: FULFILMENT_DATABASE_URL cannot be read as NAME=VALUE (an unclosed"
                " quote?): fix or remove it"
            ),
        ),
    ],
    ids=["misspelt key", "unreadable line"],
)
def test_a_bad_env_file_line_is_bad_input_naming_the_file(tmp_path, monkeypatch, line, said):
    (tmp_path / ".env").write_text(f"{line}\n")
    monkeypatch.chdir(tmp_path)

    result = fulfilment("report")

    assert result.exit_code == 2
    assert result.stderr == f"fulfilment: invalid settings: {said}\n"


@pytest.fixture
def ctrl_c_not_ignored() -> Iterator[None]:
    """SIGINT raises ``KeyboardInterrupt`` in this process, and reaches the programs it starts.

    A non-interactive shell starts a background job with SIGINT ignored (POSIX), as a job of a
    CI runner may be, and a program inherits an ignored signal; a Python handler, unlike an
    ignore, is reset to the default by ``exec``. Without this, these tests would measure how
    the suite was started, not the command.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("ctrl_c_not_ignored")
def test_ctrl_c_cancels_a_command_and_exits_130_with_the_line_it_was_given(capsys):
    cancelled = []

    async def waits() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    with pytest.raises(typer.Exit) as exited:
        run(waits(), interrupted="interrupted (Ctrl-C): nothing lost")

    assert exited.value.exit_code == 130
    assert cancelled == [True]
    assert capsys.readouterr().err == "fulfilment: interrupted (Ctrl-C): nothing lost\n"


@pytest.mark.usefixtures("ctrl_c_not_ignored")
@pytest.mark.parametrize(
    ("command", "replaced", "leaves"),
    [
        (
            ["migrate"],
            "fulfilment.tools.migrate.migrate_command",
            "the upgrade and its grants are one transaction, committed whole or not at all",
        ),
        (
            ["demo"],
            "fulfilment.demo.run.demo_command",
            (
                "the processes it started (worker, relay, warehouse simulator, dispatcher) are"
                " stopped; what they applied stays in the database"
            ),
        ),
    ],
    ids=["migrate", "demo"],
)
def test_ctrl_c_of_migrate_or_demo_says_what_it_leaves(monkeypatch, command, replaced, leaves):
    async def interrupted(*_args: object, **_options: object) -> int:
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(30)
        return 0

    monkeypatch.setattr(replaced, interrupted)

    result = fulfilment(*command)

    assert result.exit_code == 130
    assert result.stderr.startswith(f"fulfilment: interrupted (Ctrl-C): {leaves}")
    assert len(result.stderr.splitlines()) == 1


def test_ctrl_c_before_the_command_starts_closes_it_unstarted(monkeypatch, capsys):
    started = []

    async def never() -> None:
        started.append(True)

    def interrupted(_command):
        raise KeyboardInterrupt

    monkeypatch.setattr(asyncio, "run", interrupted)
    command = never()

    with pytest.raises(typer.Exit) as exited:
        run(command)

    assert exited.value.exit_code == 130
    assert inspect.getcoroutinestate(command) == inspect.CORO_CLOSED
    assert started == []
    assert capsys.readouterr().err == "fulfilment: interrupted (Ctrl-C)\n"


def _wait_for_guard(pid: int, timeout: float = 30) -> None:
    """Return once the program ``pid`` loads the command line's dependencies.

    Before its entry point runs, the interpreter is still starting, and a Ctrl-C then is the
    interpreter's to answer (it dies of SIGINT), not the program's. On a loaded machine that
    start alone can outlast a fixed delay; a compiled module of the environment's packages
    mapped into the process (``/proc/<pid>/maps``) says the entry point's guard is up, since
    only the command line, imported inside it, loads one.
    """
    packages = sysconfig.get_paths()["purelib"]
    deadline = time.monotonic() + timeout
    maps = Path(f"/proc/{pid}/maps")
    while packages not in maps.read_text():
        assert time.monotonic() < deadline, "the program loaded none of its packages"
        time.sleep(0.01)


@pytest.mark.usefixtures("ctrl_c_not_ignored")
@pytest.mark.parametrize("after_seconds", [0.3, 0.6])
def test_a_command_interrupted_as_it_starts_exits_130_with_one_line(after_seconds):
    # While the program loads its modules, reads its settings or waits for a database that
    # does not answer: every moment is one line and 130. The database is a socket that
    # listens and never accepts: the kernel completes the connection, and nothing ever answers
    # (an unrouted address may be answered by something on another network).
    fulfilment_program = str(Path(sys.executable).with_name("fulfilment"))
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        started = subprocess.Popen(
            [fulfilment_program, "report"],
            env={
                **os.environ,
                "FULFILMENT_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{port}/nowhere",
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(after_seconds)
        _wait_for_guard(started.pid)
        started.send_signal(signal.SIGINT)
        _, stderr = started.communicate(timeout=30)

    assert started.returncode == 130
    lines = stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("fulfilment: interrupted (Ctrl-C)")


def test_the_operator_commands_load_neither_the_online_retail_reader_nor_the_demo():
    # import-linter holds the tools' own imports; this holds the command line's lazy ones.
    operator_commands = (
        "fulfilment.entrypoints.cli",
        "fulfilment.tools.dlq_commands",
        "fulfilment.tools.report",
        "fulfilment.tools.outbox",
        "fulfilment.tools.migrate",
        "fulfilment.tools.stock_csv",
    )
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                f"import sys; import {', '.join(operator_commands)};"
                " print(sorted(m for m in sys.modules if m.startswith(('fulfilment.dataset',"
                " 'fulfilment.demo'))))"
            ),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout

    assert loaded == "[]\n"


def test_the_demo_where_it_is_not_installed_is_bad_input_said_in_one_line(monkeypatch):
    # As in the production image, whose wheel leaves fulfilment.demo out (tests/deploy).
    class NoDemo(importlib.abc.MetaPathFinder):
        def find_spec(self, name, *_):
            if name == "fulfilment.demo":
                missing = f"No module named {name!r}"
                raise ModuleNotFoundError(missing, name=name)

    monkeypatch.setattr(sys, "meta_path", [NoDemo(), *sys.meta_path])
    for name in ("fulfilment.demo", "fulfilment.demo.run"):
        monkeypatch.delitem(sys.modules, name, raising=False)

    result = fulfilment("demo", "--reset")

    assert result.exit_code == 2
    assert result.stderr == f"fulfilment: {DEMO_NOT_INSTALLED}\n"
