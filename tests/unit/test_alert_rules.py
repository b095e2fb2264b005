"""The Prometheus alert rules: valid, unit-tested with promtool, each linked to its runbook.

``promtool`` comes with Debian's ``prometheus`` package (``.ci/run`` installs it). Without it
these tests are skipped on a developer's machine and fail under ``CI=true``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/prometheus/alerts.yml"
RULE_TESTS = ROOT / "deploy/prometheus/alerts.test.yml"
QUEUE_RULE_TESTS = ROOT / "deploy/prometheus/alerts.queues.test.yml"
"""The tests of the alerts that name every queue, rendered by scripts/render-deploy."""
RUNBOOK = ROOT / "docs/runbook.md"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        message = "promtool is not installed (Debian package prometheus)"
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return path


def alerts() -> list[dict]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped."""
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


def test_promtool_accepts_the_rule_file() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout


def test_every_alert_fires_and_stays_quiet_in_the_promtool_unit_tests() -> None:
    result = subprocess.run(
        [promtool(), "test", "rules", str(RULE_TESTS), str(QUEUE_RULE_TESTS)],
        capture_output=True,
        text=True,
        check=False,
        cwd=RULE_TESTS.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    tested = [
        case
        for path in (RULE_TESTS, QUEUE_RULE_TESTS)
        for case in yaml.safe_load(path.read_text())["tests"]
    ]
    checks = [check for case in tested for check in case["alert_rule_test"]]
    names = {rule["alert"] for rule in alerts()}
    assert {check["alertname"] for check in checks if check["exp_alerts"]} == names
    assert {check["alertname"] for check in checks if not check["exp_alerts"]} == names


def test_every_alert_links_to_an_existing_section_of_the_runbook() -> None:
    anchors = {
        github_anchor(line.lstrip("#"))
        for line in RUNBOOK.read_text().splitlines()
        if line.startswith("#")
    }
    for rule in alerts():
        url = rule["annotations"]["runbook_url"]
        path, _, anchor = url.partition("#")
        assert path == "docs/runbook.md", rule["alert"]
        assert anchor in anchors, f"{rule['alert']}: no section #{anchor} in docs/runbook.md"


def test_every_alert_has_a_severity_and_a_summary() -> None:
    for rule in alerts():
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["labels"]["service"] == "fulfilment"
        assert rule["annotations"]["summary"]
        assert rule["annotations"]["description"]
