"""The warehouse system's HTTP client: a request's frozen body out, a class of answer back.

One pooled ``httpx.AsyncClient`` per process (:func:`build_http_client`, called by the
dispatcher's root): HTTP/1.1 with keep-alive, so that a steady stream of requests reuses a few
connections instead of a TLS handshake each; connect, read, write and pool timeouts all set
from one setting; TLS checked against the system's CAs or a CA bundle of its own.
:class:`WarehouseClient` sends one :class:`~fulfilment.domain.handoff.WarehouseRequest` with its
idempotency key and returns what :func:`~.answers.classify` makes of the answer, and asks about
a fulfilment order (:meth:`WarehouseClient.fetch`, the poll) and returns what
:func:`~.answers.classify_poll` makes of that; it never retries itself: the dispatcher does,
through the request's ``next_attempt_at`` or the order's next poll.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import urllib.parse
from dataclasses import dataclass, field

import httpx
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, StatusCode

from fulfilment.adapters.warehouse.answers import classify, classify_poll
from fulfilment.domain.handoff import (
    Accepted,
    Answer,
    Failed,
    Refused,
    RequestKind,
    WarehouseRequest,
)
from fulfilment.domain.polls import FulfilmentOrderToPoll, NotFound, PollAnswer, Polled
from fulfilment.observability.dispatcher_metrics import ANSWER_OUTCOMES, POLL_OUTCOMES
from fulfilment.observability.tracing import context_of, current_span, traceparent_of

tracer = trace.get_tracer("fulfilment.dispatcher")

ORDERS_PATH = "fulfilment-orders"
"""Path of the fulfilment orders under the API's base (``FULFILMENT_WAREHOUSE_URL``)."""

ORDERS_ROUTE = "/fulfilment-orders"
CANCELLATIONS_ROUTE = "/fulfilment-orders/{warehouse_id}/cancellations"
ORDER_ROUTE = "/fulfilment-orders/{warehouse_id}"
"""The routes of the API, as the client span's name and ``http.route`` give them."""

KEEPALIVE_EXPIRY_SECONDS = 30.0
"""How long an idle connection is kept for the next request: longer than the dispatcher's
pauses between requests at a low rate cap, shorter than common servers' keep-alive limits
would close it under the client (nginx 75 s, the simulator 30 s: the client's expiry must not
exceed the server's, or a request may meet a connection the server just closed)."""


@dataclass(frozen=True, slots=True)
class WarehouseClientOptions:
    """What the client needs, built by the dispatcher's root from the settings.

    Attributes:
        url: the API's base, e.g. ``https://wms.example/api/v1``.
        token: sent as ``Authorization: Bearer <token>``; empty: no ``Authorization``.
        timeout_seconds: one request's bound, for each of connect, write, read and the wait
            for a pooled connection, and for the request as a whole.
        ca_file: a PEM CA bundle to check the server's certificate against; None: the
            system's CAs.
        max_connections: most connections the pool opens (the concurrency cap).
        user_agent: the ``User-Agent`` header (``fulfilment/<version>``).
    """

    url: str
    token: str = field(repr=False)
    timeout_seconds: float
    ca_file: str | None
    max_connections: int
    user_agent: str


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """The TLS context of the client: certificate chain and host name checked.

    Against ``ca_file`` when given, else the system's CAs (as the broker and database
    connections do). An ``ssl.SSLContext`` rather than ``verify=<path>``, which httpx 0.28
    deprecates.

    Raises:
        OSError: ``ca_file`` cannot be read; ``ssl.SSLError``: it holds no certificate.
    """
    return ssl.create_default_context(cafile=ca_file)


def build_http_client(options: WarehouseClientOptions) -> httpx.AsyncClient:
    """The process's one pooled client for the warehouse system; the caller closes it.

    Raises:
        OSError, ssl.SSLError: ``options.ca_file`` is not a readable CA bundle.
    """
    headers = {
        "content-type": "application/json",
        "accept": "application/json",
        "user-agent": options.user_agent,
    }
    if options.token:
        headers["authorization"] = f"Bearer {options.token}"
    return httpx.AsyncClient(
        base_url=options.url,
        headers=headers,
        timeout=httpx.Timeout(options.timeout_seconds),
        limits=httpx.Limits(
            max_connections=options.max_connections,
            max_keepalive_connections=options.max_connections,
            keepalive_expiry=KEEPALIVE_EXPIRY_SECONDS,
        ),
        verify=tls_context(options.ca_file),
        http1=True,
        http2=False,
        follow_redirects=False,
        trust_env=False,
    )


class WarehouseClient:
    """Sends warehouse requests over ``http`` (from :func:`build_http_client`).

    Args:
        http: the pooled client; its base URL is the API's.
        timeout_seconds: the bound on one request as a whole (the client's timeouts bound
            each phase).
    """

    def __init__(self, http: httpx.AsyncClient, *, timeout_seconds: float) -> None:
        self._http = http
        self._timeout_seconds = timeout_seconds

    async def send(self, request: WarehouseRequest) -> tuple[Answer, float]:
        """Send ``request``'s frozen body under its key; the answer's class and the seconds taken.

        ``POST {base}/fulfilment-orders`` for a fulfilment order,
        ``POST {base}/fulfilment-orders/{warehouse_id}/cancellations`` for a cancellation, with
        ``Idempotency-Key`` and, when the request has one, ``traceparent``. A timeout or a
        connection error is a ``Retry`` (:func:`~.answers.classify`), never an exception.

        With tracing on, each call is a ``CLIENT`` span ``POST <route>``, child of the
        request's stored ``traceparent`` (the span of the delivery that recorded it, so the
        call is in the order's trace), with ``fulfilment.idempotency_key`` and the answer's
        class ``fulfilment.warehouse.answer`` (the ``outcome`` of
        ``fulfilment_warehouse_requests_total``); the ``traceparent`` header is that span's.
        With tracing off, or the stored context not sampled (no span of it would be recorded),
        the header is the stored one.
        """
        if request.kind is RequestKind.FULFILMENT_ORDER:
            path = ORDERS_PATH
        elif request.warehouse_id:
            path = (
                f"{ORDERS_PATH}/{urllib.parse.quote(request.warehouse_id, safe='')}/cancellations"
            )
        else:
            # The store makes a cancellation claimable only once its order has an id.
            return Failed(reason="no_warehouse_id", answer="cancellation without an order"), 0.0
        route = (
            ORDERS_ROUTE if request.kind is RequestKind.FULFILMENT_ORDER else CANCELLATIONS_ROUTE
        )
        url = self._http.base_url.join(path)
        with current_span(
            tracer,
            f"POST {route}",
            kind=SpanKind.CLIENT,
            parent=context_of(request.traceparent),
            attributes=lambda: {
                "http.request.method": "POST",
                "http.route": route,
                "url.full": str(url),
                "server.address": url.host,
                "server.port": url.port or (443 if url.scheme == "https" else 80),
                "fulfilment.idempotency_key": str(request.idempotency_key),
                "fulfilment.request.kind": str(request.kind),
                "fulfilment.order_id": str(request.order_id),
                "fulfilment.request.attempt": request.attempts,
            },
            record_errors=False,
        ) as span:
            # Without a span of its own the block has the stored context's: the header is that.
            answer, seconds = await self._post(
                request, path, traceparent_of(span.get_span_context()) or request.traceparent
            )
            _annotate(span, answer)
            return answer, seconds

    async def fetch(self, order: FulfilmentOrderToPoll) -> tuple[PollAnswer, float]:
        """Ask about ``order`` (``GET {base}/fulfilment-orders/{id}``); its answer's class, seconds.

        A GET changes nothing at the warehouse, so it carries no idempotency key. A timeout or
        a connection error is a ``Retry`` (:func:`~.answers.classify_poll`), never an
        exception. With tracing on, the call is a ``CLIENT`` span ``GET <route>`` of a trace
        of its own (the poll has no delivery to be part of), with the answer's class as
        ``fulfilment.warehouse.answer`` (the ``outcome`` of
        ``fulfilment_warehouse_polls_total``).
        """
        path = f"{ORDERS_PATH}/{urllib.parse.quote(order.warehouse_id, safe='')}"
        url = self._http.base_url.join(path)
        with current_span(
            tracer,
            f"GET {ORDER_ROUTE}",
            kind=SpanKind.CLIENT,
            parent=None,
            attributes=lambda: {
                "http.request.method": "GET",
                "http.route": ORDER_ROUTE,
                "url.full": str(url),
                "server.address": url.host,
                "server.port": url.port or (443 if url.scheme == "https" else 80),
                "fulfilment.order_id": str(order.order_id),
            },
            record_errors=False,
        ) as span:
            headers = {}
            traceparent = traceparent_of(span.get_span_context())
            if traceparent:
                headers["traceparent"] = traceparent
            started = time.monotonic()
            try:
                async with asyncio.timeout(self._timeout_seconds):
                    response = await self._http.get(path, headers=headers)
            except (httpx.TransportError, TimeoutError) as error:
                answer = classify_poll(order, None, None, {}, error)
            else:
                answer = classify_poll(
                    order, response.status_code, response.content, response.headers
                )
            seconds = time.monotonic() - started
            _annotate_poll(span, answer)
            return answer, seconds

    async def _post(
        self, request: WarehouseRequest, path: str, traceparent: str | None
    ) -> tuple[Answer, float]:
        """POST the body to ``path`` with the key and ``traceparent``; the answer's class."""
        headers = {"idempotency-key": str(request.idempotency_key)}
        if traceparent:
            headers["traceparent"] = traceparent
        started = time.monotonic()
        try:
            async with asyncio.timeout(self._timeout_seconds):
                response = await self._http.post(path, content=request.body, headers=headers)
        except (httpx.TransportError, TimeoutError) as error:
            return classify(request.kind, None, None, {}, error), time.monotonic() - started
        answer = classify(request.kind, response.status_code, response.content, response.headers)
        return answer, time.monotonic() - started


def _annotate(span: Span, answer: Answer) -> None:
    """The answer on the span: its class (the metric's ``outcome``), status code, error.

    A class the dispatcher tries again or gives up on is an error of the span; an accepted
    request, a refused cancellation (the warehouse's business answer) are not.
    """
    outcome = ANSWER_OUTCOMES[type(answer)]
    span.set_attribute("fulfilment.warehouse.answer", outcome)
    if answer.status_code is not None:
        span.set_attribute("http.response.status_code", answer.status_code)
    if not isinstance(answer, Accepted | Refused):
        span.set_attribute("error.type", str(answer.status_code) if answer.status_code else outcome)
        span.set_status(StatusCode.ERROR, answer.answer[:200])


def _annotate_poll(span: Span, answer: PollAnswer) -> None:
    """A poll's answer on its span: its class (the metric's ``outcome``), status code, error.

    The order found, or not found (the warehouse's answer, asked again later), are no errors
    of the span; the other classes are.
    """
    outcome = POLL_OUTCOMES[type(answer)]
    span.set_attribute("fulfilment.warehouse.answer", outcome)
    if answer.status_code is not None:
        span.set_attribute("http.response.status_code", answer.status_code)
    if not isinstance(answer, Polled | NotFound):
        span.set_attribute("error.type", str(answer.status_code) if answer.status_code else outcome)
        span.set_status(StatusCode.ERROR, answer.answer[:200])
