"""``ExitCode``: the exit statuses of the worker, the relay and every ``fulfilment`` command.

A leaf module (it imports nothing of the service), so that each program's root and each
command names the same six values (docs/cli.md, "Exit codes").
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """A process's exit status; an orchestrator or a script tells the cases apart by it."""

    OK = 0
    """The run did its job (a service: it stopped cleanly after SIGTERM or SIGINT)."""

    FAILED = 1
    """A run that failed: a start-up check of a service (topology mismatch, schema behind, a
    taken HTTP port), a consumer lost for good, a command that could not do its job, or
    invariants that do not hold."""

    BAD_INPUT = 2
    """Invalid settings (one line naming each variable), arguments or files."""

    UNAVAILABLE = 3
    """RabbitMQ or PostgreSQL does not answer."""

    REFUSED = 4
    """RabbitMQ or PostgreSQL answered but refused the user (wrong name or password, no
    permission) or has no such virtual host or database: a setting to fix, not a service to
    wait for."""

    INTERRUPTED = 130
    """A command stopped by SIGINT (Ctrl-C) before it finished: 128 and the signal's number,
    the shell's convention. What it had done stays done; the commands are safe to run again.
    The services (worker, relay, dispatcher) take SIGINT as a request to stop, like SIGTERM,
    and exit 0."""
