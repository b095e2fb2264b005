"""``fulfilment dlq``: list, show, replay or purge the dead letters."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from fulfilment.entrypoints.cli.exits import fail, run
from fulfilment.entrypoints.cli.options import (
    OperatorOption,
    YesOption,
    settings_or_exit,
    tool_options,
)
from fulfilment.entrypoints.cli.typer_tweaks import Command, Group
from fulfilment.exit_codes import ExitCode

if TYPE_CHECKING:
    from fulfilment.tools.dead_letters import Selection

app = typer.Typer(
    cls=Group,
    help="The dead-letter queues: list, show, replay or purge their messages.",
    no_args_is_help=True,
)


ID_MAX_BYTES = 255
"""The longest ``--id``: an AMQP ``message_id`` is a short string (AMQP 0-9-1, 4.2.5.3); an
``event_id`` is a UUID's 36 characters."""


def _dead_letter_ids(ids: list[str] | None) -> list[str] | None:
    """``ids`` if each can be a dead letter's id, else a usage error (exit 2) naming the first.

    An id is what ``dlq list`` and ``dlq show`` print: a body's ``event_id`` or an AMQP
    ``message_id``, one word of at most :data:`ID_MAX_BYTES` bytes; the commands match it
    exactly. A group (``permanent/MalformedEventError``) given as an id is refused with the
    option that takes it.

    Raises:
        typer.BadParameter: an id that is empty, holds a space or a control character, is
            longer than :data:`ID_MAX_BYTES`, or is a group.
    """
    from fulfilment.contracts.dead_letter import FailureClass  # noqa: PLC0415 - see the package's text

    for value in ids or ():
        failure_class, slash, _ = value.partition("/")
        if slash and failure_class in set(FailureClass):
            msg = f"{value!r} is a group, not an id: choose it with --group {value}"
            raise typer.BadParameter(msg)
        if (
            not value
            or len(value.encode()) > ID_MAX_BYTES
            or not all(character.isprintable() and not character.isspace() for character in value)
        ):
            msg = (
                f"not a dead letter's id: {value!r} (an event_id or message_id as `dlq list` or"
                f" `dlq show` prints it: one word of at most {ID_MAX_BYTES} bytes)"
            )
            raise typer.BadParameter(msg)
    return ids


IdsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--id",
        metavar="ID",
        callback=_dead_letter_ids,
        help="An event_id or message_id, as `dlq list` or `dlq show` prints it; repeat for"
        " several.",
    ),
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
        metavar="QUEUE",
        help="A dead-letter queue, or the queue it belongs to (fulfilment.order-shipped); "
        "repeat for several. Default: every dead-letter queue.",
    ),
]


CommentOption = Annotated[
    str | None, typer.Option(help="Why, for the audit table (e.g. the fix's version).")
]


@app.command("list", cls=Command)
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


@app.command("show", cls=Command)
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


@app.command("replay", cls=Command)
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


@app.command("purge", cls=Command)
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
