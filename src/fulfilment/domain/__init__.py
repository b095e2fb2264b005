"""Value objects and rules of stock reservation; standard library only.

The rules here are the specification: the tests' in-memory stock store runs them, and
production runs their PL/pgSQL implementation (``migrations/sql/``), which applies a batch
of events in one round trip (``domain.model``).
"""
