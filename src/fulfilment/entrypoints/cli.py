"""The ``fulfilment`` command: the operator tools' composition root.

Each sub-command parses its arguments, reads the settings, builds the options its tool needs,
and calls one function of ``fulfilment.tools`` (a ``*_command``); ``worker`` runs the worker's
own root, ``fulfilment.entrypoints.worker``.

Every sub-command exits 0 on success and otherwise prints one line, ``fulfilment: <reason>``,
on standard error and exits non-zero: 1 for a failed run or broken invariants, 2 for bad input
or settings, 3 for an unreachable service, 4 for a service that refused the user or has no
such virtual host or database. A group called without a command (``fulfilment``,
``fulfilment stock``, ``fulfilment dlq``, ``fulfilment warehouse``) prints its help and exits
2, as a usage error.

The help is the commands' docstrings read as Markdown, so that ``code`` shows as code, not
between backticks, and a paragraph is filled to the terminal's width.

The tools are imported by the command that runs them: imported here, SQLAlchemy, alembic and
aio-pika would load for every command, ``--help`` included (more than three times its
start-up time).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar
from uuid import UUID

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

from fulfilment import __version__
from fulfilment.domain.handoff import RequestStatus
from fulfilment.exit_codes import ExitCode
from fulfilment.settings import Settings, SettingsError, load_settings
from fulfilment.tools.command import CommandError, ToolOptions

if TYPE_CHECKING:
    # Typer vendors click; its context and help formatter types are reachable only there.
    from typer._click import Context, HelpFormatter

    from fulfilment.tools.dead_letters import Selection


def _blank_flag_types(command: TyperCommand | TyperGroup, ctx: Context) -> None:
    """Show nothing in the type column of a flag's help: it takes no value.

    Typer 0.29's rich help prints a flag's Python type there (``--yes <bool>``), as if the
    option took one; an empty metavar leaves the column blank.
    """
    for param in command.get_params(ctx):
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""


class Command(TyperCommand):
    """A sub-command whose help names no type after a flag, and whose Ctrl-C says so.

    typer turns a ``KeyboardInterrupt`` into exit 130 without a word; a command interrupted
    outside :func:`run` (loading its modules, reading its settings) says it in one line, as
    one inside it does with its own.
    """

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        """Write the help, with the type column of the flags blank."""
        _blank_flag_types(self, ctx)
        super().format_help(ctx, formatter)

    def invoke(self, ctx: Context) -> Any:  # noqa: ANN401 - click's own signature
        """Run the command; a ``KeyboardInterrupt`` out of it exits 130 with one line."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            fail("interrupted (Ctrl-C)", ExitCode.INTERRUPTED)


class Group(TyperGroup):
    """A group of commands whose help names no type after a flag."""

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        """Write the help, with the type column of the flags blank."""
        _blank_flag_types(self, ctx)
        super().format_help(ctx, formatter)


app = typer.Typer(
    cls=Group,
    name="fulfilment",
    help="Order fulfilment: reserves, releases and ships stock on order events, once per event,"
    " and tells the rest of the shop through result events.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Every help text below is read as Markdown (the sub-groups and commands inherit it).
    rich_markup_mode="markdown",
)
stock_app = typer.Typer(
    cls=Group,
    help="Stock levels: load them, or plan them from order data.",
    no_args_is_help=True,
)
app.add_typer(stock_app, name="stock")
dlq_app = typer.Typer(
    cls=Group,
    help="The dead-letter queues: list, show, replay or purge their messages.",
    no_args_is_help=True,
)
app.add_typer(dlq_app, name="dlq")
outbox_app = typer.Typer(
    cls=Group,
    no_args_is_help=True,
    help="The outbox of result events: ``fulfilment outbox prune``.",
)
app.add_typer(outbox_app, name="outbox")
warehouse_app = typer.Typer(
    cls=Group,
    no_args_is_help=True,
    help="The requests to the warehouse system: list, show or re-send them.",
)
app.add_typer(warehouse_app, name="warehouse")

T = TypeVar("T")


def fail(reason: str, code: ExitCode = ExitCode.FAILED) -> NoReturn:
    """Print ``fulfilment: <reason>`` (one line) on standard error and exit with ``code``."""
    sys.stderr.write(f"fulfilment: {' '.join(reason.split())}\n")
    raise typer.Exit(code)


def settings_or_exit() -> Settings:
    """Validated settings, or exit 2 naming every bad variable on one line."""
    try:
        return load_settings()
    except SettingsError as error:
        fail(f"invalid settings: {'; '.join(str(error).splitlines())}", ExitCode.BAD_INPUT)


def tool_options(settings: Settings) -> ToolOptions:
    """What the tools take from ``settings``: the broker, the database, the inbox's consumer."""
    from fulfilment.entrypoints.startup import database_options  # noqa: PLC0415 - loads SQLAlchemy

    return ToolOptions(
        amqp_url=settings.amqp_url.get_secret_value(),
        database=database_options(settings),
        consumer=settings.consumer_name,
    )


def run(command: Coroutine[Any, Any, T], *, interrupted: str = "interrupted (Ctrl-C)") -> T:
    """Run a tool's coroutine and return its result.

    Its :class:`CommandError` exits with the error's code; a service that is unreachable exits
    3, one that refuses the user or has no such virtual host or database exits 4, and so does a
    broker that refuses the user an operation (``ACCESS_REFUSED``); a DLQ that another ``dlq``
    command is walking exits 1, and so does a database without the schema (not migrated).
    SIGINT (Ctrl-C) cancels the coroutine and exits 130 with the line ``interrupted``, which
    says what the command leaves behind.
    """
    try:
        return _run_classified(command)
    except KeyboardInterrupt:
        # Interrupted before asyncio.run took the coroutine (in the imports above it): closed
        # here, it does not warn that it was never awaited.
        command.close()
        fail(interrupted, ExitCode.INTERRUPTED)


def _run_classified(command: Coroutine[Any, Any, T]) -> T:
    """:func:`run` but for SIGINT: the command's errors exit with their codes."""
    from aiormq.exceptions import ChannelAccessRefused  # noqa: PLC0415 - loads aiormq

    from fulfilment.adapters.postgres.errors import (  # noqa: PLC0415 - loads SQLAlchemy
        DatabaseRefusedError,
        DatabaseUnavailableError,
        privilege_refusal,
        schema_missing,
    )
    from fulfilment.adapters.rabbitmq.connection import BrokerRefusedError, BrokerUnavailableError  # noqa: PLC0415 - loads aio-pika
    from fulfilment.adapters.rabbitmq.walk import WalkInProgressError  # noqa: PLC0415 - loads aio-pika

    # The client libraries log a failed connection attempt on their own; the one-line
    # reason below says the same, once.
    for name in ("aiormq", "aio_pika"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        return asyncio.run(command)
    except (BrokerRefusedError, DatabaseRefusedError) as error:
        fail(str(error), ExitCode.REFUSED)
    except (BrokerUnavailableError, DatabaseUnavailableError) as error:
        fail(str(error), ExitCode.UNAVAILABLE)
    except ChannelAccessRefused as error:
        # A name outside the user's permissions (README, "Broker users and permissions").
        fail(
            f"RabbitMQ refused an operation: {error.args[0] if error.args else error}",
            ExitCode.REFUSED,
        )
    except CommandError as error:
        fail(str(error), error.exit_code)
    except WalkInProgressError as error:
        fail(str(error), ExitCode.FAILED)
    except Exception as error:
        # A command that needs the owner's rights, run with the runtime role's URL.
        refusal = privilege_refusal(error)
        if refusal is not None:
            fail(str(refusal), ExitCode.REFUSED)
        # A database created by hand, not migrated yet.
        missing = schema_missing(error)
        if missing is None:
            raise
        fail(missing, ExitCode.FAILED)


def _print_version(value: bool) -> None:  # noqa: FBT001 - typer passes the flag's value
    if value:
        typer.echo(f"fulfilment {__version__}")
        raise typer.Exit


@app.callback()
def root(
    *,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Options of ``fulfilment`` itself, before any command (``fulfilment --version``)."""


@app.command(cls=Command)
def worker() -> None:
    """Run the worker until SIGTERM or SIGINT (the same as ``python -m fulfilment``)."""
    from fulfilment.entrypoints.worker import main  # noqa: PLC0415 - keeps the other commands' start fast

    main()


@app.command(cls=Command)
def relay() -> None:
    """Publish the outbox's result events to ``fulfilment.events`` until SIGTERM or SIGINT.

    One replica at a time publishes (it holds a PostgreSQL advisory lock); the others stand by.
    """
    from fulfilment.entrypoints.relay import main  # noqa: PLC0415 - keeps the other commands' start fast

    main()


@app.command(cls=Command)
def dispatcher() -> None:
    """Send the recorded requests to the warehouse system until SIGTERM or SIGINT.

    Needs ``FULFILMENT_WAREHOUSE_URL`` (else exit 2). One replica at a time sends (it holds a
    PostgreSQL advisory lock); the others stand by.
    """
    from fulfilment.entrypoints.dispatcher import main  # noqa: PLC0415 - keeps the other commands' start fast

    main()


@outbox_app.command("prune", cls=Command)
def outbox_prune() -> None:
    """Delete published outbox rows older than ``FULFILMENT_OUTBOX_RETENTION_SECONDS``.

    The outbox half of ``fulfilment prune``, which the CronJob runs. In transactions of
    ``FULFILMENT_OUTBOX_PRUNE_BATCH_SIZE`` rows; unpublished rows stay. Needs the database
    **owner**'s ``FULFILMENT_DATABASE_URL``: the runtime role may not delete outbox rows
    (docs/security.md, "Least privilege").
    """
    from fulfilment.tools.outbox import prune_command  # noqa: PLC0415 - see the module's text

    settings = settings_or_exit()
    run(
        prune_command(
            tool_options(settings),
            retention_seconds=settings.outbox_retention_seconds,
            batch_size=settings.outbox_prune_batch_size,
            echo=typer.echo,
        )
    )


@app.command("prune", cls=Command)
def prune() -> None:
    """Delete what is past its retention: published outbox rows and processed ids (inbox).

    Outbox rows published more than ``FULFILMENT_OUTBOX_RETENTION_SECONDS`` ago, and inbox
    rows older than ``FULFILMENT_PROCESSED_ID_RETENTION_SECONDS`` whose event could change
    nothing if it came again; in transactions of ``FULFILMENT_OUTBOX_PRUNE_BATCH_SIZE`` rows.
    Needs the database **owner**'s ``FULFILMENT_DATABASE_URL``: the runtime role may not
    delete (docs/security.md, "Least privilege").
    """
    from fulfilment.tools.outbox import prune_all_command  # noqa: PLC0415 - see the module's text

    settings = settings_or_exit()
    run(
        prune_all_command(
            tool_options(settings),
            outbox_retention_seconds=settings.outbox_retention_seconds,
            processed_id_retention_seconds=settings.processed_id_retention_seconds,
            batch_size=settings.outbox_prune_batch_size,
            echo=typer.echo,
        )
    )


@app.command(cls=Command)
def migrate() -> None:
    """Create the database if it is missing, then ``alembic upgrade head``, then grant.

    Run it with the **owner** role's ``FULFILMENT_DATABASE_URL`` (the role that owns the
    tables; it needs ``CREATEDB`` only while the database is missing). With
    ``FULFILMENT_DATABASE_RUNTIME_ROLE``, the same transaction gives that role, the worker's
    and the relay's, only the privileges they use (docs/security.md, "Least privilege"); without it,
    one line says that nothing was granted.
    """
    from fulfilment.tools.migrate import migrate_command  # noqa: PLC0415 - see the module's text

    settings = settings_or_exit()
    run(
        migrate_command(
            settings.database_url.get_secret_value(),
            runtime_role=settings.database_runtime_role,
            echo=typer.echo,
        )
    )


@stock_app.command("load", cls=Command)
def stock_load(
    file: Annotated[Path, typer.Argument(help="CSV with header sku,on_hand.")],
) -> None:
    """Upsert on-hand stock levels from FILE; nothing changes if any row is bad.

    Needs the database **owner**'s ``FULFILMENT_DATABASE_URL``: the runtime role may change
    stock levels only through the reservation functions (docs/security.md, "Least privilege").
    """
    from fulfilment.tools.stock_csv import load_command  # noqa: PLC0415 - see the module's text

    options = tool_options(settings_or_exit())
    run(load_command(options, file, echo=typer.echo))


@stock_app.command("plan", cls=Command)
def stock_plan(
    data: Annotated[list[Path], typer.Argument(help="Online Retail CSV files or folders.")],
    out: Annotated[Path, typer.Option(help="Where to write the sku,on_hand CSV.")],
) -> None:
    """Write deterministic stock levels for the orders in DATA (some short, a few unknown)."""
    from fulfilment.dataset.stock_plan import plan_command  # noqa: PLC0415 - see the module's text

    try:
        plan_command(data, out, echo=typer.echo)
    except CommandError as error:
        fail(str(error), error.exit_code)


@app.command(cls=Command)
def publish(
    files: Annotated[list[Path], typer.Argument(help="Online Retail CSV files or folders.")],
    cancellations: Annotated[  # noqa: FBT002 - a typer flag
        bool,
        typer.Option(
            "--cancellations",
            help="Also an OrderCancelled per cancellation that can only mean one order.",
        ),
    ] = False,
) -> None:
    """Publish one OrderPlaced per invoice of FILES, persistent and confirmed.

    Ids derive from the invoice number, so publishing a file twice re-sends the same events
    (and the worker answers them as duplicates). Cancellations and non-positive lines are
    skipped and counted; with --cancellations, the cancellations mapped to an order are
    published among the orders, in time order, and the others counted by reason.
    """
    from fulfilment.dataset.publish import publish_command  # noqa: PLC0415 - see the module's text

    settings = settings_or_exit()
    run(
        publish_command(
            settings.amqp_url.get_secret_value(),
            files,
            cancellations=cancellations,
            echo=typer.echo,
        ),
        interrupted="interrupted (Ctrl-C): the events the broker confirmed stay published;"
        " publish the same files again to send the rest (ids derive from the invoices, so the"
        " worker answers those it has as duplicates)",
    )


@app.command(cls=Command)
def report(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,  # noqa: FBT002 - a typer flag
) -> None:
    """Outcome counts, dead letters by reason, pending messages, and the stock invariants.

    With the hand-off to the warehouse system (``FULFILMENT_WAREHOUSE_URL`` set, or requests
    recorded), also the requests by kind and status, how many are open and the oldest one's
    age, and how many failed or expired. Exits 1 when an invariant does not hold.
    """
    from fulfilment.tools.report import report_command  # noqa: PLC0415 - see the module's text

    settings = settings_or_exit()
    run(
        report_command(
            tool_options(settings),
            as_json=as_json,
            echo=typer.echo,
            handoff=settings.warehouse_url is not None,
        )
    )


@app.command(cls=Command)
def reconcile(
    files: Annotated[list[Path], typer.Argument(help="Online Retail CSVs that were published.")],
    cancellations: Annotated[  # noqa: FBT002 - a typer flag
        bool,
        typer.Option(
            "--cancellations",
            help="Also the OrderCancelled of each cancellation mapped to an order, as"
            " `publish --cancellations` and `demo` send them.",
        ),
    ] = False,
    shipments: Annotated[  # noqa: FBT002 - a typer flag
        bool,
        typer.Option(
            "--shipments",
            help="Also the OrderShipped of each order now reserved or shipped, as `demo`"
            " sends them at the end of each day.",
        ),
    ] = False,
) -> None:
    """Check that every event published from FILES is processed or dead-lettered, exactly once.

    Checks the OrderPlaced of every order; with --cancellations and --shipments, the other
    two kinds too, one line per kind. Exits 1 when an event is missing or a stock invariant
    does not hold.
    """
    from fulfilment.dataset.reconcile import reconcile_command  # noqa: PLC0415 - see the module's text

    options = tool_options(settings_or_exit())
    run(
        reconcile_command(
            options, files, cancellations=cancellations, shipments=shipments, echo=typer.echo
        )
    )


DEMO_NOT_INSTALLED = (
    "the demo is not part of this installation (the production image leaves it out);"
    " run it from a checkout: make demo"
)
"""Why ``fulfilment demo`` exits 2 where the package ``fulfilment.demo`` is not installed."""


@app.command(cls=Command)
def demo(
    data: Annotated[Path, typer.Argument(help="Folder (or file) of Online Retail CSVs.")] = Path(
        "data/sample/online-retail"
    ),
    reset: Annotated[  # noqa: FBT002 - a typer flag
        bool,
        typer.Option(
            help="Empty the service's tables and queues first: only a database the demo made"
            " or found empty, or one named with --confirm-reset."
        ),
    ] = False,
    confirm_reset: Annotated[
        str | None,
        typer.Option(
            "--confirm-reset",
            metavar="DATABASE",
            help="With --reset: empty this database although it is not the demo's (its name,"
            " as in FULFILMENT_DATABASE_URL).",
        ),
    ] = None,
) -> None:
    """The main job on real data: migrate, load stock, run the worker, publish, report.

    Needs the database **owner**'s ``FULFILMENT_DATABASE_URL`` (it migrates, loads stock and,
    with --reset, truncates), not the runtime role's. ``--reset`` refuses a database that
    holds rows the demo did not write (one it did not create, or find empty and mark in the
    database's comment) unless ``--confirm-reset`` names it; it prints what it removed, and
    records each dead letter it purges in ``dead_letter_audit``.

    Stock levels are planned from DATA deterministically, so some orders are rejected for
    insufficient stock and a few for unknown SKUs. Runs the worker as a child process and
    plays DATA day by day: the orders and the cancellations mapped to their order, in time
    order, then the shipment of every order still reserved at the end of its day, each step
    settled before the next. Stops the worker with SIGTERM and reconciles every published
    event of the three kinds. Runs the relay beside it and checks that the demo's queue on
    ``fulfilment.events`` (``fulfilment.demo.result-events``) received every result event the
    run wrote, valid and in order per order.
    """
    try:
        from fulfilment.demo.run import demo_command  # noqa: PLC0415 - see the module's text
    except ModuleNotFoundError as error:
        # The production wheel leaves the demo out (pyproject's wheel ``exclude``): its
        # --reset truncates the service's tables.
        if error.name != "fulfilment.demo":
            raise
        fail(DEMO_NOT_INSTALLED, ExitCode.BAD_INPUT)
    if confirm_reset is not None and not reset:
        fail(
            "--confirm-reset names the database --reset may empty: add --reset", ExitCode.BAD_INPUT
        )
    settings = settings_or_exit()
    code = run(
        demo_command(
            tool_options(settings),
            data,
            reset=reset,
            confirm_reset=confirm_reset,
            stop_grace_seconds=settings.orchestrator_grace_period_seconds,
            echo=typer.echo,
        )
    )
    if code != 0:
        raise typer.Exit(code)


IdsOption = Annotated[
    list[str] | None,
    typer.Option("--id", help="An event_id or message_id; repeat for several."),
]
GroupOption = Annotated[
    str | None,
    typer.Option(help="A group as `dlq list` shows it, e.g. permanent/MalformedEventError."),
]
AllOption = Annotated[bool, typer.Option("--all", help="Every message in the DLQs.")]
QueueOption = Annotated[
    list[str] | None,
    typer.Option(
        "--queue",
        help="A dead-letter queue, or the queue it belongs to (fulfilment.order-shipped); "
        "repeat for several. Default: every dead-letter queue.",
    ),
]
YesOption = Annotated[
    bool, typer.Option("--yes", help="Do it; without this flag the command is a dry run.")
]
OperatorOption = Annotated[
    str | None,
    typer.Option(
        help="Your name, for the audit table; recorded beside the OS user and host, "
        "which are always read from the environment."
    ),
]
CommentOption = Annotated[
    str | None, typer.Option(help="Why, for the audit table (e.g. the fix's version).")
]


@dlq_app.command("list", cls=Command)
def dlq_list(
    *,
    queues: QueueOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Dead letters grouped per DLQ by failure class and exception, with counts and oldest age.

    Reads the DLQs without removing anything.
    """
    from fulfilment.tools.dlq_commands import list_command  # noqa: PLC0415 - see the module's text

    chosen = _queues(queues)
    settings = settings_or_exit()
    run(
        list_command(
            settings.amqp_url.get_secret_value(),
            as_json=as_json,
            echo=typer.echo,
            queues=chosen,
            ttl_seconds=settings.dead_letter_ttl_seconds,
        )
    )


@dlq_app.command("show", cls=Command)
def dlq_show(  # noqa: PLR0913 - one parameter per option
    *,
    ids: IdsOption = None,
    group: GroupOption = None,
    everything: AllOption = False,
    queues: QueueOption = None,
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Every header and the body of the chosen dead letters (read, not removed)."""
    from fulfilment.tools.dlq_commands import show_command  # noqa: PLC0415 - see the module's text

    settings = settings_or_exit()
    selection = _selection(ids, group, everything=everything)
    run(
        show_command(
            settings.amqp_url.get_secret_value(),
            selection,
            limit=limit,
            as_json=as_json,
            echo=typer.echo,
            queues=_queues(queues),
            ttl_seconds=settings.dead_letter_ttl_seconds,
        )
    )


@dlq_app.command("replay", cls=Command)
def dlq_replay(  # noqa: PLR0913 - one parameter per option
    *,
    ids: IdsOption = None,
    group: GroupOption = None,
    everything: AllOption = False,
    queues: QueueOption = None,
    # 10 per second by default: slow enough that replaying a whole DLQ leaves room for live orders.
    rate: Annotated[float, typer.Option(min=0.1, help="Messages per second at most.")] = 10.0,
    yes: YesOption = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Replay dead letters replayed FULFILMENT_REPLAY_LIMIT times already."
        ),
    ] = False,
    operator: OperatorOption = None,
    comment: CommentOption = None,
) -> None:
    """Publish the chosen dead letters again where they came from, once their cause is fixed.

    Each goes back to the exchange and routing key it was first published with (`orders`
    with order.placed, order.cancelled or order.shipped). Body and ids are unchanged, so an
    event that was applied meanwhile is answered as a duplicate; broker and x-fulfilment-*
    headers are stripped, x-fulfilment-replay-count is carried and counts up. Each message
    leaves the DLQ only after the broker confirmed the republish and its audit row is written.
    A dead letter replayed FULFILMENT_REPLAY_LIMIT times is refused unless --force, and one
    older than FULFILMENT_PROCESSED_ID_RETENTION_SECONDS always (it could be applied twice);
    refused ones stay in the DLQ. A dry run unless --yes.
    """
    from fulfilment.tools.dead_letters import ReplayRules  # noqa: PLC0415 - see the module's text
    from fulfilment.tools.dlq_commands import replay_command  # noqa: PLC0415 - see the module's text

    selection = _selection(ids, group, everything=everything)
    chosen = _queues(queues)
    settings = settings_or_exit()
    run(
        replay_command(
            tool_options(settings),
            selection,
            execute=yes,
            rate_per_second=rate,
            operator=operator,
            comment=comment,
            echo=typer.echo,
            rules=ReplayRules(
                replay_limit=settings.replay_limit,
                force=force,
                max_age_seconds=settings.processed_id_retention_seconds,
            ),
            queues=chosen,
            ttl_seconds=settings.dead_letter_ttl_seconds,
        )
    )


@dlq_app.command("purge", cls=Command)
def dlq_purge(  # noqa: PLR0913 - one parameter per option
    *,
    ids: IdsOption = None,
    group: GroupOption = None,
    everything: AllOption = False,
    queues: QueueOption = None,
    yes: YesOption = False,
    operator: OperatorOption = None,
    comment: CommentOption = None,
) -> None:
    """Remove the chosen dead letters for good, each after its audit row (with the body).

    A dry run unless --yes.
    """
    from fulfilment.tools.dlq_commands import purge_command  # noqa: PLC0415 - see the module's text

    selection = _selection(ids, group, everything=everything)
    chosen = _queues(queues)
    settings = settings_or_exit()
    run(
        purge_command(
            tool_options(settings),
            selection,
            execute=yes,
            operator=operator,
            comment=comment,
            echo=typer.echo,
            queues=chosen,
            ttl_seconds=settings.dead_letter_ttl_seconds,
        )
    )


def _selection(ids: list[str] | None, group: str | None, *, everything: bool) -> Selection:
    """The dead letters chosen by the options, or exit 2 unless exactly one way was given."""
    from fulfilment.tools.dead_letters import Selection  # noqa: PLC0415 - see the module's text

    try:
        return Selection.build(ids or [], group, everything=everything)
    except ValueError as error:
        fail(str(error), ExitCode.BAD_INPUT)


def _queues(names: list[str] | None) -> tuple[str, ...]:
    """The dead-letter queues the ``--queue`` options choose (all without one), or exit 2."""
    from fulfilment.tools.dead_letters import dead_letter_queues  # noqa: PLC0415 - see the module's text

    try:
        return dead_letter_queues(names or [])
    except ValueError as error:
        fail(str(error), ExitCode.BAD_INPUT)


KeysArgument = Annotated[
    list[str],
    typer.Argument(
        metavar="KEY", help="Idempotency keys (UUIDs) as `fulfilment warehouse list` shows them."
    ),
]


@warehouse_app.command("list", cls=Command)
def warehouse_list(
    *,
    statuses: Annotated[
        list[RequestStatus] | None,
        typer.Option(
            "--status",
            metavar="STATUS",
            help="Only requests in this status (pending, sending, accepted, refused, failed,"
            " withdrawn, expired); repeat for several. Default: pending, sending, failed and"
            " expired, every one the warehouse has not settled.",
        ),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """The requests to the warehouse system in the chosen statuses, oldest first.

    One line each: idempotency key, kind, status, attempts, the last HTTP status code, when it
    was recorded, and its order; then how many of all the requests in those statuses these are.
    Reads, changes nothing.
    """
    from fulfilment.tools.warehouse_requests import list_command  # noqa: PLC0415 - see the module's text

    options = tool_options(settings_or_exit())
    run(list_command(options, statuses or (), limit=limit, as_json=as_json, echo=typer.echo))


@warehouse_app.command("show", cls=Command)
def warehouse_show(
    keys: KeysArgument,
    *,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Everything about the requests with these keys, the body sent included.

    Kind, order, status, attempts, times, the warehouse's id, the last HTTP status code and
    answer, the lines, and the body: the exact bytes sent, frozen at the first attempt (none
    before). A key that matches no request exits 1.
    """
    from fulfilment.tools.warehouse_requests import show_command  # noqa: PLC0415 - see the module's text

    uuids = _request_keys(keys)
    options = tool_options(settings_or_exit())
    run(show_command(options, uuids, as_json=as_json, echo=typer.echo))


@warehouse_app.command("resend", cls=Command)
def warehouse_resend(
    keys: KeysArgument,
    *,
    yes: YesOption = False,
    operator: OperatorOption = None,
) -> None:
    """Send failed or expired requests again, with the same idempotency key and the same body.

    Each goes back to ``sending``, due now; the dispatcher sends it at its next turn. Any other
    status is refused, and so is a fulfilment order whose order is no longer reserved (its body
    would hand the warehouse units the order no longer holds). Each re-send writes a row of
    ``warehouse_request_audit`` (who, when, the status before). A dry run unless --yes; exits 1
    when no key matches a request, or when --yes refused some (after the summary).
    """
    from fulfilment.tools.warehouse_requests import resend_command  # noqa: PLC0415 - see the module's text

    uuids = _request_keys(keys)
    options = tool_options(settings_or_exit())
    run(resend_command(options, uuids, execute=yes, operator=operator, echo=typer.echo))


def _request_keys(keys: list[str]) -> list[UUID]:
    """``keys`` as UUIDs, or exit 2 naming the first that is not one.

    Typed ``str`` on the command line, not ``UUID``, so that the help and the runbook may
    write ``KEY``: the check is here, with the command's one-line failure.
    """
    uuids = []
    for key in keys:
        try:
            uuids.append(UUID(key))
        except ValueError:
            fail(f"not an idempotency key (a UUID): {key!r}", ExitCode.BAD_INPUT)
    return uuids
