"""The upgrade suite: the previous release's processes beside this tree's, under load, through
the migration and a rolling update (make test-upgrade).

Its tests are marked ``upgrade`` and run only when the marker expression names ``upgrade``
(``pytest -m upgrade``): a plain ``pytest`` leaves them out, as they install another release
and run two of them for a minute. The previous release is the newest of ``releases.toml``
older than this tree's version, built from its commit and installed once per session.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from tests.e2e.warehouse_harness import SimulatorProcess
from tests.support.markers import run_only_when_named
from tests.support.services import admin_execute, service_unavailable, throwaway_database
from tests.upgrade.upgradelib import (
    TABLES,
    InstalledRelease,
    head_version,
    install_release,
    previous_release,
    recorded_releases,
)

FOLDER = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark this folder's tests ``upgrade``; leave them out unless ``-m`` names the marker."""
    run_only_when_named("upgrade", FOLDER, config, items)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print each run's table of figures."""
    for text in TABLES:
        terminalreporter.write_line("")
        for line in text.splitlines():
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def previous() -> Iterator[InstalledRelease]:
    """The previous release, built from its commit and installed in a folder removed at the end."""
    release = previous_release(head_version(), recorded_releases())
    with tempfile.TemporaryDirectory(prefix=f"fulfilment-{release.version}-") as folder:
        yield install_release(release, Path(folder))


@pytest.fixture
def upgrade_database() -> Iterator[str]:
    """A new, empty database (``postgresql+asyncpg`` URL): the previous release migrates it."""
    try:
        asyncio.run(admin_execute("SELECT 1"))
    except (OSError, asyncpg.PostgresError, TimeoutError) as error:
        service_unavailable("PostgreSQL", error)
    with throwaway_database("fulfilment_upgrade") as url:
        yield url


@pytest.fixture
def simulator(tmp_path: Path) -> Iterator[SimulatorProcess]:
    """The project's simulated warehouse system on a port of its own, killed at the end."""
    stock = SimulatorProcess(tmp_path / "simulator.log")
    stock.start()
    try:
        yield stock
    finally:
        stock.stop()
