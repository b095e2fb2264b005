"""structlog configuration: JSON lines for machines, a readable console for people."""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog


def configure_logging(
    *,
    level: str = "INFO",
    log_format: Literal["auto", "json", "console"] = "auto",
) -> None:
    """Route structlog and the standard library's loggers to standard error.

    ``auto`` picks JSON unless standard error is a terminal, so containers and CI get one JSON
    object per line and a developer gets colours. Library loggers (FastStream, aio-pika,
    uvicorn, alembic) go through the same renderer so that a log stream has one format.
    """
    json = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
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
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
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


def _keep(
    _logger: object, _name: str, event_dict: structlog.types.EventDict
) -> structlog.types.EventDict:
    return event_dict
