"""Adapters: the outside world (PostgreSQL, files) behind the application's ports."""
