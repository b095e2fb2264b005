"""The demo's failure: a step that did not work, said in one line."""

from __future__ import annotations

from fulfilment.tools.command import CommandError


class DemoError(CommandError):
    """A step of the demo failed; the message says which and why (exit 1)."""
