"""``python -m fulfilment`` runs the worker, like ``fulfilment worker``."""

from fulfilment.main import main

main()
