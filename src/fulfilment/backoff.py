"""``doubling_wait``: the one back-off of the loops that are not a call retried.

Where the service retries one call until it succeeds it uses tenacity's public API
(``AsyncRetrying`` with ``wait_exponential_jitter``, a stop and ``retry_if_exception_type``:
the database's retry policy, the relay's and the dispatcher's reconnects, the relay's wait
for its start). The other loops are not that shape, and take their waits from this function:
a dead letter's publish whose give-up is decided on the next wait before it is slept
(``worker.dead_lettering``), a paused consumer that sleeps before its first look at the database
(``worker.consumer_control``), a supervisor that restarts a background task whatever ended it
(``worker.monitors``), the relay's re-publish of a batch with rows the broker returned, inside
a session that goes on (``relay.service``), and the dispatcher's waits that are recorded in
the store rather than slept (a request's next attempt, the circuit's next probe:
``dispatcher.service``).
"""

from __future__ import annotations

import random


def doubling_wait(failures: int, *, first: float, cap: float, jitter: float = 0.0) -> float:
    """Seconds to wait after ``failures`` failures in a row (0 for the first wait).

    ``min(first * 2 ** failures + random.uniform(0, jitter), cap)``: ``first`` doubled for
    each failure after the first, plus up to ``jitter`` seconds drawn at random so that
    replicas that failed together do not try again together, never more than ``cap``. The
    formula is tenacity's ``wait_exponential_jitter`` (``multiplier=first``, ``max=cap``) at
    attempt ``failures + 1``, so a loop waits as a retry would.
    """
    try:
        doubled = first * 2.0**failures
    except OverflowError:
        return cap
    return min(doubled + random.uniform(0, jitter), cap)  # noqa: S311 - spreading waits, not a secret
