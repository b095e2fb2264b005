"""The relay: publishes the outbox's result events to RabbitMQ (``fulfilment relay``)."""
