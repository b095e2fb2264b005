"""The database pool follows the prefetch unless it is set: one connection per handler."""

from __future__ import annotations

import pytest

from fulfilment.settings import Settings


@pytest.fixture(autouse=True)
def no_environment(monkeypatch):
    for name in ("FULFILMENT_PREFETCH_COUNT", "FULFILMENT_DATABASE_POOL_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir("/")  # no .env file


def test_by_default_the_pool_has_a_connection_for_every_prefetched_delivery():
    settings = Settings()

    assert settings.database_pool_size == settings.prefetch_count == 32


def test_an_unset_pool_size_follows_the_prefetch_count_from_the_environment(monkeypatch):
    monkeypatch.setenv("FULFILMENT_PREFETCH_COUNT", "12")

    assert Settings().database_pool_size == 12


def test_a_pool_size_that_is_set_wins_over_the_prefetch_count(monkeypatch):
    monkeypatch.setenv("FULFILMENT_PREFETCH_COUNT", "64")
    monkeypatch.setenv("FULFILMENT_DATABASE_POOL_SIZE", "16")

    assert Settings().database_pool_size == 16
    assert Settings(prefetch_count=8, database_pool_size=4).database_pool_size == 4
