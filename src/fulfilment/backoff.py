"""``Backoff``: tenacity's doubling waits for the loops that are not one call retried.

Where the service retries one call until it succeeds it uses tenacity's ``AsyncRetrying``
(the database's retry policy, the relay's reconnects). Four loops are not that shape: a dead
letter's publish whose give-up is decided on the next wait before it is slept
(``worker.delivery``), a paused consumer that sleeps before its first look at the database
(``worker.consumer_control``), a supervisor that restarts a background task whatever ended it
(``worker.monitors``), and the relay's re-publish of a batch with rows the broker returned,
inside a session that goes on (``relay.service``). They take their waits from tenacity's
``wait_exponential`` through this class, so every back-off of the service is computed by one
library, without jitter, as each loop did by hand.
"""

from __future__ import annotations

from tenacity import RetryCallState, Retrying, wait_exponential


class Backoff:
    """Waits of ``first_seconds``, doubled at each :meth:`next` up to ``max_seconds``.

    The n-th wait since the start (or the last :meth:`reset`) is
    ``min(first_seconds * 2 ** (n - 1), max_seconds)`` seconds.
    """

    def __init__(self, first_seconds: float, max_seconds: float) -> None:
        """Start at the first wait."""
        self._wait = wait_exponential(multiplier=first_seconds, max=max_seconds)
        self._state = RetryCallState(Retrying(), None, (), {})

    def next(self) -> float:
        """The wait before the next try, in seconds; the one after it doubles."""
        wait = float(self._wait(self._state))
        self._state.attempt_number += 1
        return wait

    def reset(self) -> None:
        """Start again at the first wait (after a success)."""
        self._state.attempt_number = 1
