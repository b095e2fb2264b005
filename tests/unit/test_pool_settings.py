"""The reservation pool size and batch maximum: a few connections, batches up to the prefetch."""

from __future__ import annotations

import pytest

from fulfilment.adapters.postgres import stock
from fulfilment.settings import DatabaseSettings, Settings, WorkerSettings


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

    assert settings.database.pool_size == 2
    assert settings.worker.reservation_batch_max == settings.worker.prefetch_count == 64


def test_an_unset_batch_max_follows_the_prefetch_count_from_the_environment(monkeypatch):
    monkeypatch.setenv("FULFILMENT_PREFETCH_COUNT", "12")

    assert Settings().worker.reservation_batch_max == 12


def test_a_batch_max_that_is_set_wins_over_the_prefetch_count(monkeypatch):
    monkeypatch.setenv("FULFILMENT_PREFETCH_COUNT", "64")
    monkeypatch.setenv("FULFILMENT_RESERVATION_BATCH_MAX", "1")

    assert Settings().worker.reservation_batch_max == 1
    assert WorkerSettings(prefetch_count=8, reservation_batch_max=4).reservation_batch_max == 4


def test_a_batch_max_above_the_prefetch_count_is_refused_naming_both(monkeypatch):
    # A batch gathers the deliveries in flight, and the prefetch bounds those.
    monkeypatch.setenv("FULFILMENT_PREFETCH_COUNT", "8")
    monkeypatch.setenv("FULFILMENT_RESERVATION_BATCH_MAX", "9")

    with pytest.raises(
        ValueError, match="FULFILMENT_RESERVATION_BATCH_MAX=9 must not be more"
    ) as raised:
        WorkerSettings()

    assert "FULFILMENT_PREFETCH_COUNT=8" in str(raised.value)


@pytest.mark.parametrize(
    ("group", "name"), [(DatabaseSettings, "pool_size"), (WorkerSettings, "reservation_batch_max")]
)
def test_a_pool_size_or_batch_max_of_zero_is_refused(group, name):
    with pytest.raises(ValueError, match=name):
        group(**{name: 0})


def test_a_bad_prefetch_count_is_reported_alone_not_as_the_batch_it_would_set(monkeypatch):
    monkeypatch.setenv("FULFILMENT_PREFETCH_COUNT", "2000")

    with pytest.raises(ValueError, match="prefetch_count") as raised:
        WorkerSettings()

    assert "reservation_batch_max" not in str(raised.value)


def test_the_warehouse_defaults_are_the_settings_defaults():
    # Written twice, so that the adapter does not read the settings; held equal here.
    settings = Settings()

    assert settings.database.pool_size == stock.DEFAULT_POOL_SIZE
    assert settings.worker.reservation_batch_max == stock.DEFAULT_BATCH_MAX
