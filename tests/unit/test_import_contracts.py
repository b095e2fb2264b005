"""The import contract that keeps the test suite out of the service covers all of its helpers."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]
CONTRACT = "The service imports nothing of the test suite or the benchmark"


def _forbidden() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = (c for c in config["tool"]["importlinter"]["contracts"] if c["name"] == CONTRACT)
    assert contract["source_modules"] == ["fulfilment"]
    return set(contract["forbidden_modules"])


def test_every_helper_module_of_the_test_suite_is_inside_the_forbidden_tests_package() -> None:
    helpers = [
        path
        for path in (ROOT / "tests").rglob("*.py")
        if not path.name.startswith("test_") and path.name != "__init__.py"
    ]
    outside = [
        str(path.relative_to(ROOT))
        for path in helpers
        if not all(
            (folder / "__init__.py").is_file()
            for folder in path.parents
            if folder.is_relative_to(ROOT / "tests")
        )
    ]

    assert helpers
    assert outside == []
    assert "tests" in _forbidden()


def test_the_test_libraries_and_the_benchmark_are_forbidden_to_the_service() -> None:
    assert {"tests", "bench", "pytest", "hypothesis", "testcontainers"} <= _forbidden()
