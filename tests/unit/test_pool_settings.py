"""The reservation pool size and batch maximum: a few connections, batches up to the prefetch."""

from __future__ import annotations

import pytest

from fulfilment.adapters.postgres import warehouse
from fulfilment.settings import Settings


@pytest.fixture(autouse=True)
def no_environment(monkeypatch):
    for name in (
        "FULFILMENT_PREFETCH_COUNT",
        "FULFILMENT_DATABASE_POOL_SIZE",
        "FULFILMENT_RESERVATION_BATCH_MAX",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir("/")  # no .env file


def test_by_default_the_pool_size_is_two_and_the_batch_max_the_prefetch_count():
    settings = Settings()

    assert settings.database_pool_size == 2
    assert settings.reservation_batch_max == settings.prefetch_count == 64


def test_an_unset_batch_max_follows_the_prefetch_count_from_the_environment(monkeypatch):
    monkeypatch.setenv("FULFILMENT_PREFETCH_COUNT", "12")

    assert Settings().reservation_batch_max == 12


def test_a_batch_max_that_is_set_wins_over_the_prefetch_count(monkeypatch):
    monkeypatch.setenv("FULFILMENT_PREFETCH_COUNT", "64")
    monkeypatch.setenv("FULFILMENT_RESERVATION_BATCH_MAX", "1")

    assert Settings().reservation_batch_max == 1
    assert Settings(prefetch_count=8, reservation_batch_max=4).reservation_batch_max == 4


@pytest.mark.parametrize(
    ("name", "value"), [("database_pool_size", 0), ("reservation_batch_max", 0)]
)
def test_a_pool_size_or_batch_max_of_zero_is_refused(name, value):
    with pytest.raises(ValueError, match=name):
        Settings(**{name: value})


def test_a_bad_prefetch_count_is_reported_alone_not_as_the_batch_it_would_set(monkeypatch):
    monkeypatch.setenv("FULFILMENT_PREFETCH_COUNT", "2000")

    with pytest.raises(ValueError, match="prefetch_count") as raised:
        Settings()

    assert "reservation_batch_max" not in str(raised.value)


def test_the_warehouse_defaults_are_the_settings_defaults():
    # Written twice, so that the adapter does not read the settings; held equal here.
    settings = Settings()

    assert settings.database_pool_size == warehouse.DEFAULT_POOL_SIZE
    assert settings.reservation_batch_max == warehouse.DEFAULT_BATCH_MAX
