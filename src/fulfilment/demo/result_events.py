"""The demo's check of the result events: what a consumer of ``fulfilment.events`` received.

The demo binds a queue of its own to ``fulfilment.events`` before it publishes anything, and
once the relay has published every outbox row the run wrote, it reads that queue. A
:class:`ResultEventTally` takes the run's outbox rows, then each received message, and says
whether the consumer got what docs/design.md ("Result events and the relay") promises it:

- every result event written in the run arrives, at least once (at least once: the same
  ``event_id`` may arrive again, counted apart as a duplicate);
- every body is valid under the published contract (``parse_result_event`` by the routing
  key), and carries the routing key and order of its outbox row;
- per order (per SKU for ``stock.adjusted`` and ``stock.shortage``), events first arrive in
  ``outbox.id`` order (commit order).

Messages whose ``event_id`` is not among the run's rows were written before the run (an
earlier run, or rows the relay had not published yet): they are counted apart and do not
fail the check.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from uuid import UUID

from pydantic import ValidationError

from fulfilment.adapters.postgres.admin import OutboxEntry
from fulfilment.contracts.result_events import (
    RESULT_EVENTS,
    UnknownRoutingKeyError,
    parse_result_event,
    subject_of,
)

RESULT_EVENTS_QUEUE = "fulfilment.demo.result-events"
"""The demo's own queue (durable, classic), bound to ``fulfilment.events`` with ``#``: a
consumer of every result event, as the shop's other services are. Declared before anything
is published, emptied by reading it at the end of each run, purged by ``--reset``. Not part
of the service's topology: the worker and the relay know nothing of it."""
RESULT_EVENTS_BINDING = "#"
"""The binding key of :data:`RESULT_EVENTS_QUEUE`: every routing key."""


class ResultEventTally:
    """Counts the received result events against the outbox rows of one run.

    Memory grows with the run's result events (ids only, never bodies) and its orders.
    """

    def __init__(self, run_rows: Iterable[OutboxEntry]) -> None:
        """``run_rows``: the outbox rows the run wrote (``admin.outbox_entries_after``)."""
        self._rows = {row.event_id: row for row in run_rows}
        self.published: Counter[str] = Counter(row.routing_key for row in self._rows.values())
        """Outbox rows of the run, per routing key."""
        self.received: Counter[str] = Counter()
        """Distinct ``event_id`` of the run received, per routing key."""
        self.duplicates: Counter[str] = Counter()
        """Messages of the run whose ``event_id`` had arrived before, per routing key."""
        self.earlier = 0
        """Valid messages whose ``event_id`` the run did not write (written before it)."""
        self.invalid = 0
        """Messages refused: a body the contract refuses, or that contradicts its row."""
        self.out_of_order = 0
        """Events that first arrived after a later event (by ``outbox.id``) of their order."""
        self._first_problem: str | None = None
        self._seen: set[UUID] = set()
        self._last_id: dict[str, int] = {}

    def receive(self, routing_key: str, body: bytes) -> None:
        """Count one received message, delivered with ``routing_key``."""
        try:
            event = parse_result_event(routing_key, body)
        except (UnknownRoutingKeyError, ValidationError) as error:
            self.invalid += 1
            reason = str(error).splitlines()[0]
            self._note(f"a {routing_key} message does not validate: {reason}")
            return
        row = self._rows.get(event.event_id)
        if row is None:
            self.earlier += 1
            return
        subject = subject_of(event)
        if (row.routing_key, row.subject) != (routing_key, subject):
            self.invalid += 1
            self._note(
                f"event {event.event_id} came as {routing_key} of {subject}; its"
                f" outbox row is {row.routing_key} of {row.subject}"
            )
            return
        if event.event_id in self._seen:
            self.duplicates[routing_key] += 1
            return
        self._seen.add(event.event_id)
        self.received[routing_key] += 1
        last = self._last_id.get(row.subject, 0)
        if row.id < last:
            self.out_of_order += 1
            about = f"order {row.order_id}" if row.order_id is not None else f"SKU {row.sku}"
            self._note(
                f"{about}: {routing_key} (outbox id {row.id}) came after the event"
                f" of outbox id {last}"
            )
        else:
            self._last_id[row.subject] = row.id

    def lines(self, queue: str) -> list[str]:
        """The demo's lines: a title, then one per routing key, then what else arrived.

        E.g. ``  stock.reserved: published 132, received 132 (duplicates 0)``.
        """
        title = (
            "result events of this run (outbox rows written; distinct event_ids received on"
            f" {queue}):"
        )
        lines = [title]
        lines += [
            f"  {key}: published {self.published[key]}, received {self.received[key]}"
            f" (duplicates {self.duplicates[key]})"
            for key in RESULT_EVENTS
        ]
        if not self.published.total():
            lines.append(
                "  this run wrote no result event: its events changed nothing (duplicates)"
            )
        if self.earlier:
            lines.append(f"  also received {self.earlier} written before this run (not counted)")
        return lines

    def failure(self) -> str | None:
        """One line saying what is wrong, or None when every check holds."""
        problems = [
            f"{key} published {self.published[key]}, received {self.received[key]}"
            for key in RESULT_EVENTS
            if self.published[key] != self.received[key]
        ]
        if self.invalid:
            problems.append(f"{self.invalid} invalid")
        if self.out_of_order:
            problems.append(f"{self.out_of_order} out of outbox order")
        if not problems:
            return None
        first = f" (first: {self._first_problem})" if self._first_problem else ""
        return "result events: " + ", ".join(problems) + first

    def _note(self, problem: str) -> None:
        # The first problem names an event to look at; the counts say how many more there are.
        if self._first_problem is None:
            self._first_problem = problem
