"""How a command ends: the exception-to-exit-code map, and the one line a failure prints.

Every ``fulfilment`` command exits 0 on success and otherwise prints one line,
``fulfilment: <reason>``, on standard error and exits with an :class:`ExitCode`
(``fulfilment.exit_codes``, a leaf that the tools and the services import too): :func:`run`
maps the errors of the tools, the adapters and the client libraries to those codes. It sits
in the command line, not beside ``ExitCode``, because it imports the adapters' errors, which
the tools and the data set that name ``ExitCode`` must not load.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Coroutine
from typing import Any, NoReturn, TypeVar

import typer

from fulfilment.exit_codes import ExitCode
from fulfilment.tools.command import CommandError

T = TypeVar("T")


def fail(reason: str, code: ExitCode = ExitCode.FAILED) -> NoReturn:
    """Print ``fulfilment: <reason>`` (one line) on standard error and exit with ``code``."""
    sys.stderr.write(f"fulfilment: {' '.join(reason.split())}\n")
    raise typer.Exit(code)


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
        # A name outside the user's permissions (docs/security.md, "Broker users and permissions").
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
