"""Suites that run only when asked: the cluster, failover and upgrade suites' collection hook."""

from __future__ import annotations

from pathlib import Path

import pytest


def run_only_when_named(
    marker: str, folder: Path, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Mark the tests under ``folder`` with ``marker``; deselect them unless ``-m`` names it.

    Called from each suite's ``pytest_collection_modifyitems``, so that ``pytest`` alone leaves
    out the suites that start clusters or release builds (``make test-cluster`` and the like run
    them with ``-m``).
    """
    chosen = marker in (config.getoption("markexpr") or "")
    left_out = []
    for item in items:
        if folder in item.path.parents:
            item.add_marker(getattr(pytest.mark, marker))
            if not chosen:
                left_out.append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if item not in left_out]
