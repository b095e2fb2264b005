"""Logs and metrics of the service."""
