"""A collector for the tests: an OTLP/HTTP receiver that decodes what the service exports.

It answers ``POST /v1/traces`` as a collector does (``application/x-protobuf``, an
``ExportTraceServiceRequest`` in, an empty ``ExportTraceServiceResponse`` out, gzip or not)
and keeps every span it decoded, flattened into :class:`ReceivedSpan`.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

KINDS = {
    Span.SPAN_KIND_INTERNAL: "internal",
    Span.SPAN_KIND_SERVER: "server",
    Span.SPAN_KIND_CLIENT: "client",
    Span.SPAN_KIND_PRODUCER: "producer",
    Span.SPAN_KIND_CONSUMER: "consumer",
}


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span; ids in lower-case hex, ``parent_id`` empty for a root span."""

    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    links: list[tuple[str, str]]
    status_code: int


@dataclass
class Receiver:
    """The spans received so far (thread-safe), and the port the server listens on."""

    port: int = 0
    requests: int = 0
    _spans: list[ReceivedSpan] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, request: ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                received.extend(
                    ReceivedSpan(
                        service=str(resource.get("service.name", "")),
                        name=span.name,
                        kind=KINDS.get(span.kind, "unspecified"),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        attributes=_attributes(span.attributes),
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                        status_code=span.status.code,
                    )
                    for span in scope_spans.spans
                )
        with self._lock:
            self.requests += 1
            self._spans.extend(received)

    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def wait_until(
        self, arrived: Callable[[list[ReceivedSpan]], bool], *, timeout: float = 30
    ) -> list[ReceivedSpan]:
        """The spans received once ``arrived`` holds of them, or after ``timeout`` seconds.

        A span ends after the spans inside it and may come in a later export than they do, so
        a test waits for the spans it needs rather than for a count of any.
        """
        deadline = time.monotonic() + timeout
        while not arrived(self.spans) and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.spans


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(attributes: Any) -> dict[str, Any]:
    return {attribute.key: _value(attribute.value) for attribute in attributes}


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """Serve an OTLP/HTTP receiver on a free port of 127.0.0.1 while the block runs."""
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            receiver.add(request)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
