"""RabbitMQ for the command line and the worker's side jobs (not the worker's hot path), by job.

- ``connection``: opening a connection, and the one-line errors of one that failed or was lost;
- ``publishing``: publishing events and messages, confirmed;
- ``inspection``: looking into queues (depth, consumers, the messages of a DLQ) without
  taking anything;
- ``walk``: walking a queue deeper than one look can hold, page by page (``fulfilment dlq``);
- ``demo_queue``: the demo's own queue on ``fulfilment.events``.
"""
