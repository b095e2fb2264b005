"""The ports the worker's handlers call (``ports.Stock``); imports the domain only.

A handler (``routes.table``) turns an event into its command and calls the stock store
directly: each use case is one call of the port, whose guarantees (idempotence, the outcomes,
what raises) are documented on it.
"""
