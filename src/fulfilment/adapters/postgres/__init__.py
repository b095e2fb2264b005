"""PostgreSQL: schema, engine, ``PostgresStock``, its retry policy and the outcome report.

Modules: ``tables`` and ``schema.migrate``, ``engine.create_engine``,
``stock.PostgresStock``, ``retry``, ``outcomes.outcome_report``, ``errors`` (what a
failure means: unreachable or refused), ``privileges`` (the runtime role's grants),
``outbox`` and ``inbox`` (the relay's reads and marks, the retention of both),
``dead_letter_audit``, and ``admin`` (the operator tools' chores). Nothing is re-exported
here, so that importing the tables (as ``migrations/env.py`` does) does not import the
stock store and its dependencies.
"""
