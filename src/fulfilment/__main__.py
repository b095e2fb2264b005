"""``python -m fulfilment`` runs the worker, like ``fulfilment worker``."""

from fulfilment.entrypoints.worker import main

main()
