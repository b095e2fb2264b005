"""The warehouse's inventory, read a page at a time: ``GET {base}/inventory?after=<sku>&limit=<n>``.

:func:`read_inventory` walks the pages from the first SKU to the last with the process's pooled
client (``client.build_http_client``: the dispatcher's credentials, CA and timeouts) and a gate
entered around every request, retries included: a rate limiter (the dispatcher's shape,
``dispatcher.service.rate_limiter``, built by the caller from
``FULFILMENT_WAREHOUSE_RATE_PER_SECOND``) takes a token of it; the active dispatcher's gate
(``Dispatcher.inventory_gate``) also waits for its sends and polls and holds one of its slots
through the request. A 429 holds the next request until its ``Retry-After`` ends. A 5xx, a
timeout or a connection error is tried again after a doubling wait with jitter (tenacity), at
most :data:`ATTEMPTS` times per page; 401 or 403 stops at once; any other answer, or a 200 whose
body is no :class:`~fulfilment.contracts.warehouse_inventory.InventoryPageV1`, is an error. It
reads, and changes nothing at the warehouse.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from http import HTTPStatus

import httpx
from pydantic import ValidationError
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from fulfilment.adapters.warehouse.answers import (
    ANSWER_CHARS,
    DEFAULT_RATE_LIMIT_SECONDS,
    retry_after_seconds,
)
from fulfilment.contracts.warehouse_inventory import InventoryPageV1

INVENTORY_PATH = "inventory"
"""Path of the inventory under the API's base (``FULFILMENT_WAREHOUSE_URL``)."""

PAGE_LIMIT = 500
"""SKUs asked for per page: 10,000 SKUs are 20 requests, 8 s at the default cap of 2.5 a second."""

ATTEMPTS = 5
"""Tries of one page answered 5xx, timed out or not connected, before the read gives up."""

RATE_LIMITED_ATTEMPTS = 20
"""Tries of one page answered 429 before the read gives up (each waits its ``Retry-After``)."""

BACKOFF_INITIAL_SECONDS = 1.0
"""The first wait before a page answered 5xx or not at all is tried again (then doubling)."""

BACKOFF_MAX_SECONDS = 30.0
"""The longest wait between two tries of a page after a 5xx or a transport error."""


class InventoryReadError(Exception):
    """The inventory could not be read; ``str(error)`` says why (no secret in it)."""


class InventoryUnavailableError(InventoryReadError):
    """The warehouse did not answer, or answered 5xx, :data:`ATTEMPTS` times in a row."""


class InventoryRefusedError(InventoryReadError):
    """The warehouse refused the credentials (401, 403): ``FULFILMENT_WAREHOUSE_TOKEN``."""


class _TransientError(Exception):
    """A try to make again: ``after`` seconds to wait (a 429's), or None (back off)."""

    def __init__(self, reason: str, after: float | None = None) -> None:
        super().__init__(reason)
        self.after = after


@dataclass(frozen=True, slots=True)
class WarehouseInventory:
    """The warehouse's on hand by SKU, every page read.

    Attributes:
        as_of: the first page's ``as_of`` (the pages are read one after another, not at once).
        on_hand: units on the shelf by SKU.
        pages: requests answered 200.
    """

    as_of: datetime
    on_hand: dict[str, int]
    pages: int


async def read_inventory(
    http: httpx.AsyncClient,
    gate: AbstractAsyncContextManager[object],
    *,
    timeout_seconds: float,
    page_limit: int = PAGE_LIMIT,
    backoff_seconds: float = BACKOFF_INITIAL_SECONDS,
) -> WarehouseInventory:
    """Every page of the warehouse's inventory, from the first SKU to the last.

    Args:
        http: the pooled client; its base URL is the API's, its headers carry the token.
        gate: entered around each request (an ``AsyncLimiter``: one token per request).
        timeout_seconds: the bound on one request as a whole.
        page_limit: the ``limit`` of each request.
        backoff_seconds: the first wait after a 5xx or a transport error (then doubling, up
            to :data:`BACKOFF_MAX_SECONDS`, plus up to as much jitter).

    Raises:
        InventoryUnavailableError: a page answered 5xx or not at all :data:`ATTEMPTS` times,
            or 429 :data:`RATE_LIMITED_ATTEMPTS` times.
        InventoryRefusedError: 401 or 403.
        InventoryReadError: another status, a body that is not a page, or a ``next`` that does
            not move forward (a warehouse that would page for ever).
    """
    reader = _Reader(http, gate, page_limit, timeout_seconds, backoff_seconds)
    on_hand: dict[str, int] = {}
    after = ""
    first: InventoryPageV1 | None = None
    pages = 0
    while True:
        page = await reader.page(after)
        pages += 1
        first = first or page
        for item in page.items:
            on_hand[item.sku] = item.on_hand
        if page.next is None:
            return WarehouseInventory(as_of=first.as_of, on_hand=on_hand, pages=pages)
        if page.next <= after:
            msg = f"the warehouse's inventory page after {after!r} gives next {page.next!r}"
            raise InventoryReadError(msg)
        after = page.next


def _waits(backoff_seconds: float) -> Callable[[RetryCallState], float]:
    """A 429's ``Retry-After``, else a doubling wait with jitter from ``backoff_seconds``."""
    backoff = wait_exponential_jitter(
        multiplier=backoff_seconds, max=BACKOFF_MAX_SECONDS, jitter=backoff_seconds
    )

    def wait(state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        if isinstance(error, _TransientError) and error.after is not None:
            return error.after
        return backoff(state)

    return wait


def _stop(state: RetryCallState) -> bool:
    """Stop after :data:`ATTEMPTS` failures, or :data:`RATE_LIMITED_ATTEMPTS` 429s."""
    error = state.outcome.exception() if state.outcome is not None else None
    limit = (
        RATE_LIMITED_ATTEMPTS
        if isinstance(error, _TransientError) and error.after is not None
        else ATTEMPTS
    )
    return stop_after_attempt(limit)(state)


@dataclass(frozen=True, slots=True)
class _Reader:
    """How every page is asked for: :func:`read_inventory`'s arguments."""

    http: httpx.AsyncClient
    gate: AbstractAsyncContextManager[object]
    limit: int
    timeout_seconds: float
    backoff_seconds: float

    async def page(self, after: str) -> InventoryPageV1:
        """The page after ``after``, tried again as the module says."""
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(_TransientError),
            wait=_waits(self.backoff_seconds),
            stop=_stop,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._try(after)
        except _TransientError as error:
            msg = f"the warehouse's inventory did not answer: {error}"
            raise InventoryUnavailableError(msg) from error
        raise AssertionError  # pragma: no cover - AsyncRetrying returns or raises

    async def _try(self, after: str) -> InventoryPageV1:
        params = {"limit": str(self.limit)}
        if after:
            params["after"] = after
        async with self.gate:
            started = time.monotonic()
            try:
                async with asyncio.timeout(self.timeout_seconds):
                    response = await self.http.get(INVENTORY_PATH, params=params)
            except TimeoutError as error:
                msg = f"no answer within {self.timeout_seconds:g} s"
                raise _TransientError(msg) from error
            except httpx.TransportError as error:
                msg = f"{type(error).__name__} after {time.monotonic() - started:.1f} s"
                raise _TransientError(msg) from error
        return _page_of(response)


def _page_of(response: httpx.Response) -> InventoryPageV1:
    """The page a 200 carries; a 429, a 5xx: try again; anything else: the read fails."""
    status = response.status_code
    text = response.text[:ANSWER_CHARS]
    if status == HTTPStatus.OK:
        try:
            return InventoryPageV1.model_validate_json(response.content)
        except ValidationError as error:
            count = error.error_count()
            msg = f"the warehouse's inventory page is not one ({count} errors): {text}"
            raise InventoryReadError(msg) from error
    if status == HTTPStatus.TOO_MANY_REQUESTS:
        after_seconds = retry_after_seconds(response.headers.get("retry-after"))
        wait = DEFAULT_RATE_LIMIT_SECONDS if after_seconds is None else after_seconds
        msg = "429 rate limited"
        raise _TransientError(msg, after=wait)
    if status >= HTTPStatus.INTERNAL_SERVER_ERROR:
        msg = f"{status} {text}"
        raise _TransientError(msg)
    if status in {HTTPStatus.UNAUTHORIZED, HTTPStatus.FORBIDDEN}:
        msg = f"the warehouse refused the credentials ({status}): check FULFILMENT_WAREHOUSE_TOKEN"
        raise InventoryRefusedError(msg)
    msg = f"the warehouse answered the inventory read {status}: {text}"
    raise InventoryReadError(msg)
