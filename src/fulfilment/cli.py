"""The ``fulfilment`` command.

Every sub-command exits 0 on success and otherwise prints one line, ``fulfilment: <reason>``,
on standard error and exits non-zero: 1 for a failed run or broken invariants, 2 for bad input
or settings, 3 for an unreachable service.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer

from fulfilment.settings import Settings, SettingsError, load_settings
from fulfilment.tools.command import ToolOptions

app = typer.Typer(
    name="fulfilment",
    help="Order-fulfilment worker: reserves stock for OrderPlaced events, once per event.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
stock_app = typer.Typer(help="Stock levels: load them, or plan them from order data.")
app.add_typer(stock_app, name="stock")
dlq_app = typer.Typer(
    help="The dead-letter queue: list, show, replay or purge its messages.",
    no_args_is_help=True,
)
app.add_typer(dlq_app, name="dlq")

T = TypeVar("T")

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_UNAVAILABLE = 3


def fail(reason: str, code: int = EXIT_FAILED) -> NoReturn:
    """Print ``fulfilment: <reason>`` (one line) on standard error and exit with ``code``."""
    sys.stderr.write(f"fulfilment: {' '.join(reason.split())}\n")
    raise typer.Exit(code)


def settings_or_exit() -> Settings:
    """Validated settings, or exit 2 naming every bad variable on one line."""
    try:
        return load_settings()
    except SettingsError as error:
        fail(f"invalid settings: {'; '.join(str(error).splitlines())}", EXIT_BAD_INPUT)


def tool_options(settings: Settings) -> ToolOptions:
    """What the tools take from ``settings``: the broker, the database, the inbox's consumer."""
    from fulfilment.composition import database_options  # noqa: PLC0415 - loads SQLAlchemy

    return ToolOptions(
        amqp_url=settings.amqp_url.get_secret_value(),
        database=database_options(settings),
        consumer=settings.consumer_name,
    )


def run(coroutine_factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine, turning an unreachable service into exit 3 with one line."""
    from fulfilment.adapters.postgres.admin import DatabaseUnavailableError  # noqa: PLC0415
    from fulfilment.adapters.rabbitmq import BrokerUnavailableError  # noqa: PLC0415

    # The client libraries log a failed connection attempt on their own; the one-line
    # reason below says the same, once.
    for name in ("aiormq", "aio_pika"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        return asyncio.run(coroutine_factory())
    except (BrokerUnavailableError, DatabaseUnavailableError) as error:
        fail(str(error), EXIT_UNAVAILABLE)


@app.command()
def worker() -> None:
    """Run the worker until SIGTERM or SIGINT (the same as ``python -m fulfilment``)."""
    from fulfilment.main import main  # noqa: PLC0415 - keeps the other commands' start fast

    main()


@app.command()
def migrate() -> None:
    """Create the database if it is missing, then ``alembic upgrade head``."""
    from fulfilment.adapters.postgres.admin import ensure_database  # noqa: PLC0415
    from fulfilment.adapters.postgres.schema import migrate as upgrade  # noqa: PLC0415

    settings = settings_or_exit()
    url = settings.database_url.get_secret_value()
    run(lambda: ensure_database(url))
    upgrade(url)
    typer.echo("database migrated to head")


@stock_app.command("load")
def stock_load(
    file: Annotated[Path, typer.Argument(help="CSV with header sku,on_hand.")],
) -> None:
    """Upsert on-hand stock levels from FILE; nothing changes if any row is bad."""
    from fulfilment.adapters.postgres.admin import warehouse_session  # noqa: PLC0415
    from fulfilment.adapters.postgres.errors import StockBelowReservedError  # noqa: PLC0415
    from fulfilment.tools.stock_csv import StockCsvError, read_stock_csv  # noqa: PLC0415

    options = tool_options(settings_or_exit())
    try:
        levels = read_stock_csv(file)
    except (StockCsvError, OSError) as error:
        fail(str(error), EXIT_BAD_INPUT)

    async def load() -> None:
        async with warehouse_session(options.database, consumer=options.consumer) as warehouse:
            await warehouse.put_stock(levels)

    try:
        run(load)
    except StockBelowReservedError as error:
        fail(f"{file}: {error}", EXIT_BAD_INPUT)
    typer.echo(f"loaded {len(levels)} stock levels from {file}")


@stock_app.command("plan")
def stock_plan(
    data: Annotated[list[Path], typer.Argument(help="Online Retail CSV files or folders.")],
    out: Annotated[Path, typer.Option(help="Where to write the sku,on_hand CSV.")],
) -> None:
    """Write deterministic stock levels for the orders in DATA (some short, a few unknown)."""
    from fulfilment.tools.stock_plan import plan_stock, write_stock_csv  # noqa: PLC0415

    orders = _read_orders(data).orders
    levels = plan_stock(orders)
    try:
        write_stock_csv(levels, out)
    except OSError as error:
        fail(f"{out}: cannot write: {error.strerror or error}", EXIT_BAD_INPUT)
    typer.echo(f"planned {len(levels)} stock levels for {len(orders)} orders into {out}")


@app.command()
def publish(
    files: Annotated[list[Path], typer.Argument(help="Online Retail CSV files or folders.")],
) -> None:
    """Publish one OrderPlaced per invoice of FILES, persistent and confirmed.

    Ids derive from the invoice number, so publishing a file twice re-sends the same events
    (and the worker answers them as duplicates). Cancellations and non-positive lines are
    skipped and counted.
    """
    settings = settings_or_exit()
    result = _read_orders(files)
    published = run(lambda: _publish(settings, result.orders))
    typer.echo(f"published {published} events (skipped: {result.skipped.describe()})")


@app.command()
def report(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,  # noqa: FBT002 - a typer flag
) -> None:
    """Outcome counts, dead letters by reason, pending messages, and the stock invariants.

    Exits 1 when an invariant does not hold.
    """
    from fulfilment.tools.report import collect_report, render_report  # noqa: PLC0415

    options = tool_options(settings_or_exit())
    document = run(lambda: collect_report(options))
    typer.echo(
        json.dumps(document, indent=2, sort_keys=True) if as_json else render_report(document)
    )
    if not document["invariants"]["ok"]:
        fail("stock invariants do not hold (see the report above)")


@app.command()
def reconcile(
    files: Annotated[list[Path], typer.Argument(help="Online Retail CSVs that were published.")],
) -> None:
    """Check that every event published from FILES is processed or dead-lettered, exactly once.

    Exits 1 when an event is missing or a stock invariant does not hold.
    """
    from fulfilment.tools.report import reconcile as check  # noqa: PLC0415

    options = tool_options(settings_or_exit())
    event_ids = [order.event_id for order in _read_orders(files).orders]
    result = run(lambda: check(options, event_ids))
    typer.echo(result.describe())
    if not result.ok:
        fail(f"{len(result.missing)} events missing or stock invariants broken")


@app.command()
def demo(
    data: Annotated[Path, typer.Argument(help="Folder (or file) of Online Retail CSVs.")] = Path(
        "data/sample/online-retail"
    ),
    reset: Annotated[  # noqa: FBT002 - a typer flag
        bool,
        typer.Option(help="Empty the service's tables and queues first (demo databases only)."),
    ] = False,
) -> None:
    """The main job on real data: migrate, load stock, run the worker, publish, report.

    Stock levels are planned from DATA deterministically, so some orders are rejected for
    insufficient stock and a few for unknown SKUs. Runs the worker as a child process, waits
    until the queue is drained, stops it with SIGTERM, and reconciles every published event.
    """
    from fulfilment.adapters.rabbitmq import UnroutableError  # noqa: PLC0415
    from fulfilment.tools.demo import DemoError, run_demo  # noqa: PLC0415

    settings = settings_or_exit()
    orders = _read_orders([data])
    try:
        code = run(
            lambda: run_demo(
                tool_options(settings),
                orders,
                reset=reset,
                stop_grace_seconds=settings.orchestrator_grace_period_seconds,
                echo=typer.echo,
            )
        )
    except (DemoError, UnroutableError) as error:
        fail(str(error))
    if code != 0:
        raise typer.Exit(code)


def _read_orders(paths: list[Path]) -> Any:  # noqa: ANN401 - ReadResult, imported lazily
    from fulfilment.tools.online_retail import OnlineRetailError, csv_files, read_orders  # noqa: PLC0415

    try:
        files = [file for path in paths for file in csv_files(path)]
        return read_orders(files)
    except (OnlineRetailError, OSError) as error:
        fail(str(error), EXIT_BAD_INPUT)


async def _publish(settings: Settings, orders: list[Any]) -> int:
    from fulfilment.adapters.rabbitmq import OutgoingEvent, UnroutableError, connect, publish_events  # noqa: PLC0415
    from fulfilment.contracts.topology import ORDER_PLACED_ROUTING_KEY, ORDERS_EXCHANGE  # noqa: PLC0415

    events = [OutgoingEvent(order.body(), str(order.event_id)) for order in orders]
    async with connect(settings.amqp_url.get_secret_value()) as connection:
        try:
            return await publish_events(
                connection, events, exchange=ORDERS_EXCHANGE, routing_key=ORDER_PLACED_ROUTING_KEY
            )
        except UnroutableError as error:
            fail(str(error))


IdsOption = Annotated[
    list[str] | None,
    typer.Option("--id", help="An event_id or message_id; repeat for several."),
]
GroupOption = Annotated[
    str | None,
    typer.Option(help="A group as `dlq list` shows it, e.g. permanent/MalformedEventError."),
]
AllOption = Annotated[bool, typer.Option("--all", help="Every message in the DLQ.")]
YesOption = Annotated[
    bool, typer.Option("--yes", help="Do it; without this flag the command is a dry run.")
]
OperatorOption = Annotated[
    str | None, typer.Option(help="Who runs this, for the audit table (default: $USER).")
]
CommentOption = Annotated[
    str | None, typer.Option(help="Why, for the audit table (e.g. the fix's version).")
]


@dlq_app.command("list")
def dlq_list(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,  # noqa: FBT002 - a typer flag
) -> None:
    """Dead letters grouped by failure class and exception, with counts and oldest age.

    Reads the DLQ without removing anything.
    """
    from fulfilment.adapters.rabbitmq import connect  # noqa: PLC0415
    from fulfilment.tools.dlq import list_groups, render_groups  # noqa: PLC0415

    settings = settings_or_exit()

    async def collect() -> Any:  # noqa: ANN401 - list[Group], imported lazily
        async with connect(settings.amqp_url.get_secret_value()) as connection:
            return await list_groups(connection)

    groups = run(collect)
    if as_json:
        document = [
            {
                "group": group.key,
                "failure_class": group.failure_class,
                "exception_type": group.exception_type,
                "count": group.count,
                "oldest_dead_lettered_at": group.oldest.isoformat() if group.oldest else None,
                "example_reason": group.example_reason,
                "event_ids_sample": group.event_ids,
            }
            for group in groups
        ]
        typer.echo(json.dumps(document, indent=2))
    else:
        typer.echo(render_groups(groups))


@dlq_app.command("show")
def dlq_show(
    *,
    ids: IdsOption = None,
    group: GroupOption = None,
    everything: AllOption = False,
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Every header and the body of the chosen dead letters (read, not removed)."""
    from fulfilment.adapters.rabbitmq import connect  # noqa: PLC0415
    from fulfilment.tools.dlq import find, render_letter  # noqa: PLC0415

    settings = settings_or_exit()
    selection = _selection(ids, group, everything=everything)

    async def collect() -> Any:  # noqa: ANN401 - list[DeadLetter], imported lazily
        async with connect(settings.amqp_url.get_secret_value()) as connection:
            return await find(connection, selection)

    letters = run(collect)[:limit]
    if as_json:
        typer.echo(json.dumps([letter.to_document() for letter in letters], indent=2))
    elif not letters:
        typer.echo("no dead letter matches")
    else:
        typer.echo("\n\n".join(render_letter(letter) for letter in letters))


@dlq_app.command("replay")
def dlq_replay(  # noqa: PLR0913 - one parameter per option
    *,
    ids: IdsOption = None,
    group: GroupOption = None,
    everything: AllOption = False,
    # 10 per second by default: slow enough that replaying a whole DLQ leaves room for live orders.
    rate: Annotated[float, typer.Option(min=0.1, help="Messages per second at most.")] = 10.0,
    yes: YesOption = False,
    operator: OperatorOption = None,
    comment: CommentOption = None,
) -> None:
    """Publish the chosen dead letters to `orders` again, once their cause is fixed.

    Body and ids are unchanged, so an event that was applied meanwhile is answered as a
    duplicate; broker and x-fulfilment-* headers are stripped. Each message leaves the DLQ
    only after the broker confirmed the republish and its audit row is written. A dry run
    unless --yes.
    """
    from fulfilment.tools.dlq import ReplayStoppedError, replay  # noqa: PLC0415

    selection = _selection(ids, group, everything=everything)
    try:
        result = _dlq_run(
            lambda connection, audit, on_each: replay(
                connection,
                selection,
                audit=audit,
                execute=yes,
                rate_per_second=rate,
                operator=_operator(operator),
                comment=comment,
                on_each=on_each,
            ),
            execute=yes,
            verb="replay",
        )
    except ReplayStoppedError as error:
        fail(f"{error}; the rest are still in the dead-letter queue")
    _summarise(result, verb="replayed")


@dlq_app.command("purge")
def dlq_purge(  # noqa: PLR0913 - one parameter per option
    *,
    ids: IdsOption = None,
    group: GroupOption = None,
    everything: AllOption = False,
    yes: YesOption = False,
    operator: OperatorOption = None,
    comment: CommentOption = None,
) -> None:
    """Remove the chosen dead letters for good, each after its audit row (with the body).

    A dry run unless --yes.
    """
    from fulfilment.tools.dlq import purge  # noqa: PLC0415

    selection = _selection(ids, group, everything=everything)
    result = _dlq_run(
        lambda connection, audit, on_each: purge(
            connection,
            selection,
            audit=audit,
            execute=yes,
            operator=_operator(operator),
            comment=comment,
            on_each=on_each,
        ),
        execute=yes,
        verb="purge",
    )
    _summarise(result, verb="purged")


def _selection(ids: list[str] | None, group: str | None, *, everything: bool) -> Any:  # noqa: ANN401 - Selection, imported lazily
    from fulfilment.tools.dlq import Selection  # noqa: PLC0415

    try:
        return Selection.build(ids or [], group, everything=everything)
    except ValueError as error:
        fail(str(error), EXIT_BAD_INPUT)


def _operator(given: str | None) -> str:
    import getpass  # noqa: PLC0415

    if given:
        return given
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no user name in the environment or the password database
        return "unknown"


def _dlq_run(action: Callable[..., Coroutine[Any, Any, T]], *, execute: bool, verb: str) -> T:
    """Run a replay or purge with a broker connection and, to execute, the audit database."""
    from fulfilment.adapters.postgres.admin import warehouse_session  # noqa: PLC0415
    from fulfilment.adapters.rabbitmq import connect  # noqa: PLC0415
    from fulfilment.tools.dlq import DeadLetter  # noqa: PLC0415

    options = tool_options(settings_or_exit())

    def each(letter: DeadLetter) -> None:
        described = letter.description
        done = {"replay": "replayed", "purge": "purged"}[verb] if execute else f"{verb} (dry run)"
        typer.echo(f"{done}: {described.event_id or letter.message.message_id}  {described.group}")

    async def go() -> T:
        async with connect(options.amqp_url) as connection:
            if not execute:
                return await action(connection, None, each)
            async with warehouse_session(options.database, consumer=options.consumer) as warehouse:
                return await action(connection, warehouse.engine, each)

    return run(go)


def _summarise(result: Any, *, verb: str) -> None:  # noqa: ANN401 - RunResult, imported lazily
    if not result.executed:
        typer.echo(
            f"dry run: {result.matched} dead letter(s) would be {verb}; "
            "nothing changed (add --yes to do it)"
        )
    else:
        typer.echo(f"{verb} {result.done} of {result.matched} dead letter(s), run {result.run_id}")
