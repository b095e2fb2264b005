"""Adapters: the outside world behind the application's ports.

PostgreSQL (``postgres/``) and RabbitMQ (``rabbitmq``: connections, publishing, the DLQ walk).
"""
