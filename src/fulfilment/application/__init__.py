"""The ports the worker's handlers call (``ports.Warehouse``); imports the domain only.

A handler (``routes.table``) turns an event into its command and calls the warehouse
directly: each use case is one call of the port, whose guarantees (idempotence, the outcomes,
what raises) are documented on it.
"""
