"""structlog configuration: JSON lines for machines, a readable console for people."""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog
from opentelemetry import trace


class _NamedWriteLogger(structlog.WriteLogger):
    """structlog's ``WriteLogger`` with the name it was asked for, read by ``add_logger_name``."""

    def __init__(self, name: str, file: TextIO) -> None:
        super().__init__(file)
        self.name = name


def configure_logging(
    *,
    level: str = "INFO",
    log_format: Literal["auto", "json", "console"] = "auto",
) -> None:
    """Route structlog and the standard library's loggers to standard error.

    ``auto`` picks JSON unless standard error is a terminal, so containers and CI get one JSON
    object per line and a developer gets colours. Library loggers (FastStream, aio-pika,
    uvicorn, alembic) go through the same renderer so that a log stream has one format.

    The service's own loggers (``structlog.get_logger("fulfilment.…")``) render and write each
    line themselves, filtered by level before any work is done (structlog's
    ``make_filtering_bound_logger``), instead of going through the standard library's records,
    handler and formatter: the worker writes a line per delivery, which took 82 to 92 µs of
    CPU that way and takes 22 to 30 µs this way (``bench/log_line.py``, two runs each on 2
    vCPUs). Both write whole lines to the same stream.
    """
    json = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_trace_ids,
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info if json else _keep,
            renderer,
        ],
        logger_factory=_logger_factory,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info if json else _keep,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # One line per message is the service's own; FastStream's per-message "Received" and
    # "Processed" lines would triple the volume and say less.
    logging.getLogger("faststream.access").setLevel(logging.WARNING)
    for name in ("faststream", "faststream.access", "uvicorn", "uvicorn.error"):
        # FastStream and uvicorn attach handlers of their own at import; one format wins.
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)


def add_trace_ids(
    _logger: object, _name: str, event_dict: structlog.types.EventDict
) -> structlog.types.EventDict:
    """Add ``trace_id`` (32 hex) and ``span_id`` (16 hex) of the current span, if there is one.

    With tracing off, or under an unsampled parent, the current span is the delivery's
    incoming parent (``observability.tracing.current_span``), so a line still names the trace
    its event came in.
    """
    span_context = trace.get_current_span().get_span_context()
    if span_context.is_valid:
        event_dict["trace_id"] = f"{span_context.trace_id:032x}"
        event_dict["span_id"] = f"{span_context.span_id:016x}"
    return event_dict


def _logger_factory(*args: object) -> _NamedWriteLogger:
    # Standard error as it is now, not as it was at import: a test may have replaced it.
    return _NamedWriteLogger(str(args[0]) if args else "", sys.stderr)


def _keep(
    _logger: object, _name: str, event_dict: structlog.types.EventDict
) -> structlog.types.EventDict:
    return event_dict
