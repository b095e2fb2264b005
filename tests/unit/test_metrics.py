"""The worker's metrics: what the dashboard and the alert rules query is what it (or the relay,
the dispatcher or the webhook intake) exports."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from fulfilment.contracts.dead_letter import SERVICE_FAILURE_CLASSES
from fulfilment.contracts.result_events import RESULT_ROUTING_KEYS
from fulfilment.entrypoints.worker import build_worker, new_metrics
from fulfilment.intake.signatures import Refusal
from fulfilment.observability.dispatcher_metrics import DispatcherMetrics
from fulfilment.observability.intake_metrics import IntakeMetrics
from fulfilment.observability.metrics import Metrics
from fulfilment.observability.relay_metrics import RelayMetrics
from fulfilment.routes.table import DEAD_LETTER_QUEUES, QUEUE_ROUTES, SUBSCRIBED_QUEUES
from fulfilment.settings import Settings
from tests.support.fakes import FakeStock

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy/grafana/dashboards/fulfilment.json"
RULES = ROOT / "deploy/prometheus/alerts.yml"
METRIC_NAME = re.compile(r"\bfulfilment_[a-z_]+\b")


async def _no_database() -> None:
    return None


def exported_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name the registry can export, children or not (histograms as 3 names)."""
    names: set[str] = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_count", "_sum"))
        else:
            names.add(family.name)
    return names


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def rule_expressions() -> list[str]:
    document = yaml.safe_load(RULES.read_text())
    return [rule["expr"] for group in document["groups"] for rule in group["rules"]]


@pytest.fixture
def worker_registry() -> CollectorRegistry:
    worker = build_worker(Settings(), stock=FakeStock(), database_ping=_no_database)
    return worker.metrics.registry


def test_every_metric_of_the_dashboard_and_the_alerts_is_exported(worker_registry) -> None:
    used = {
        name
        for expression in dashboard_expressions() + rule_expressions()
        for name in METRIC_NAME.findall(expression)
    }
    assert used  # the pattern finds names at all
    relay = RelayMetrics(RESULT_ROUTING_KEYS).registry
    dispatcher = DispatcherMetrics().registry
    intake = IntakeMetrics(version="", refusals=tuple(str(reason) for reason in Refusal)).registry
    missing = (
        used
        - exported_names(worker_registry)
        - exported_names(relay)
        - exported_names(dispatcher)
        - exported_names(intake)
    )
    assert missing == set()


def test_the_name_check_would_notice_a_metric_the_worker_does_not_export(worker_registry) -> None:
    assert "fulfilment_events_totl" not in exported_names(worker_registry)
    assert "fulfilment_handler_duration_seconds_bucket" in exported_names(worker_registry)
    assert "fulfilment_events_total" in exported_names(worker_registry)


def test_the_worker_exports_no_metric_of_faststream(worker_registry) -> None:
    # Its Prometheus middleware repeated the service's outcome counter and handler duration
    # for CPU on every delivery; the dashboard and the alerts read the service's own.
    assert [name for name in exported_names(worker_registry) if "faststream" in name] == []


PROCESS_SERIES = (
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_cpu_seconds_total",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
    "python_info",
    "python_gc_collections_total",
)
"""prometheus-client's process, platform and garbage collector series (Linux)."""


def test_the_worker_exports_its_memory_cpu_and_open_files_on_its_own_registry(
    worker_registry,
) -> None:
    served = generate_latest(worker_registry).decode()

    for name in PROCESS_SERIES:
        assert re.search(rf"^{name}(\{{[^}}]*\}})? \S+$", served, re.MULTILINE), name


def test_the_dashboard_panels_have_unique_ids_and_use_the_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] == "fulfilment"
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_dashboard_query_selects_the_chosen_namespace_and_pods() -> None:
    # Two deployments scraped by one Prometheus must not add up in one panel.
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {variable["name"] for variable in dashboard["templating"]["list"]}
    assert {"namespace", "pod"} <= variables
    selector = re.compile(r"\bfulfilment_[a-z_]+\{([^}]*)\}")
    for expression in dashboard_expressions():
        bare = METRIC_NAME.findall(expression)
        selected = selector.findall(expression)
        assert len(selected) == len(bare), expression
        for labels in selected:
            assert 'namespace=~"$namespace"' in labels, expression
            assert 'pod=~"$pod"' in labels, expression


def test_every_outcome_series_exists_at_zero_before_the_first_event() -> None:
    metrics = new_metrics()

    samples = {
        (sample.labels["event"], sample.labels["outcome"], sample.labels["reason"]): sample.value
        for family in metrics.registry.collect()
        if family.name == "fulfilment_events"
        for sample in family.samples
        if sample.name == "fulfilment_events_total"
    }

    # What the delivery policy adds to every event: dead letters by class (and the rejects
    # left to the broker's dead-lettering), and requeues.
    policy = {
        **{("dead_lettered", str(failure)): 0 for failure in SERVICE_FAILURE_CLASSES},
        ("dead_lettered", "broker_rejected"): 0,
        ("requeued", "transient"): 0,
        ("requeued", "dead_letter_refused"): 0,
    }
    by_event = {
        "order_placed": {
            ("reserved", ""): 0,
            ("rejected", "insufficient_stock"): 0,
            ("rejected", "unknown_sku"): 0,
            ("rejected", "cancelled"): 0,
            ("duplicate", "event"): 0,
            ("duplicate", "order"): 0,
            **policy,
        },
        "order_cancelled": {
            ("released", ""): 0,
            ("partially_released", ""): 0,
            ("tombstoned", ""): 0,
            ("ignored", ""): 0,
            ("cancel_after_ship", ""): 0,
            ("cancel_requested", ""): 0,
            ("duplicate", "event"): 0,
            **policy,
        },
        "order_shipped": {
            ("shipped", ""): 0,
            ("ignored", ""): 0,
            ("duplicate", "event"): 0,
            ("dead_lettered", "order_not_reserved"): 0,
            **policy,
        },
    }
    # The three events' labels are pinned above; a queue's route added since brings its own
    # list. The warehouse's webhooks are not the worker's: their routes bind none here.
    for route in QUEUE_ROUTES:
        by_event.setdefault(route.event, {**dict.fromkeys(route.outcomes, 0), **policy})
    assert samples == {
        (event, outcome, reason): value
        for event, outcomes in by_event.items()
        for (outcome, reason), value in outcomes.items()
    }


def test_the_bound_event_child_is_the_labelled_series() -> None:
    metrics = Metrics()

    metrics.event("order_placed", "rejected", "unknown_sku").inc()
    metrics.event("order_placed", "rejected", "unknown_sku").inc()

    assert (
        metrics.registry.get_sample_value(
            "fulfilment_events_total",
            {"event": "order_placed", "outcome": "rejected", "reason": "unknown_sku"},
        )
        == 2
    )


def test_every_database_retry_series_exists_at_zero_before_the_first_retry() -> None:
    metrics = new_metrics()

    samples = {
        sample.labels["error"]: sample.value
        for family in metrics.registry.collect()
        if family.name == "fulfilment_database_retries"
        for sample in family.samples
        if sample.name == "fulfilment_database_retries_total"
    }

    # The labels the dashboard, the alerts and the runbook know.
    assert samples == dict.fromkeys(
        [
            "serialization_failure",
            "deadlock",
            "lock_timeout",
            "statement_timeout",
            "server_shutdown",
            "server_starting",
            "too_many_connections",
            "read_only",
            "connection",
            "pool_timeout",
            "other",
        ],
        0,
    )


@pytest.mark.parametrize("label", ["deadlock", "connection", "pool_timeout", "other"])
def test_database_retries_are_counted_under_their_label(label) -> None:
    metrics = new_metrics()

    metrics.count_database_retry(label)
    metrics.count_database_retry(label)

    assert (
        metrics.registry.get_sample_value("fulfilment_database_retries_total", {"error": label})
        == 2
    )


def test_the_dead_letter_age_grows_between_polls_and_is_zero_when_empty() -> None:
    metrics = Metrics()
    age = "fulfilment_dead_letters_oldest_age_seconds"
    assert metrics.registry.get_sample_value(age) is None  # not measured yet

    metrics.set_oldest_dead_letter(time.time() - 90)
    assert 90 <= (metrics.registry.get_sample_value(age) or 0) < 95

    metrics.set_oldest_dead_letter(None)
    assert metrics.registry.get_sample_value(age) == 0


def test_the_queue_series_are_absent_rather_than_stale_once_forgotten() -> None:
    metrics = Metrics()
    for name in (*(queue.name for queue in SUBSCRIBED_QUEUES), *DEAD_LETTER_QUEUES):
        metrics.queue_ready.labels(name).set(1)
        metrics.queue_consumers.labels(name).set(1)
    metrics.set_oldest_dead_letter(time.time() - 90)

    metrics.forget_queues()

    exposition = generate_latest(metrics.registry).decode()
    for name in (
        "fulfilment_queue_messages_ready",
        "fulfilment_queue_consumers",
        "fulfilment_dead_letters_oldest_age_seconds",
    ):
        assert f"# TYPE {name} gauge" in exposition  # still described, so the name is known
        assert not [line for line in exposition.splitlines() if line.startswith(name)], name


def test_the_invariant_series_are_absent_until_checked_and_once_forgotten() -> None:
    metrics = Metrics()
    violations = "fulfilment_stock_invariant_violations"
    orphans = {"invariant": "orphan_lines"}
    assert metrics.registry.get_sample_value(violations, orphans) is None

    metrics.stock_invariant_violations.labels("orphan_lines").set(0)
    assert metrics.registry.get_sample_value(violations, orphans) == 0

    metrics.forget_invariants()
    assert metrics.registry.get_sample_value(violations, orphans) is None


def test_the_build_info_names_the_version() -> None:
    metrics = Metrics(version="1.2.3")

    assert metrics.registry.get_sample_value("fulfilment_build_info", {"version": "1.2.3"}) == 1


def test_the_relay_exports_the_build_info_with_the_worker_s_labels() -> None:
    worker = Metrics(version="1.2.3").registry
    relay = RelayMetrics(RESULT_ROUTING_KEYS, version="1.2.3").registry

    labels = {"version": "1.2.3"}
    assert relay.get_sample_value("fulfilment_build_info", labels) == 1
    assert worker.get_sample_value("fulfilment_build_info", labels) == 1


def test_the_pod_choice_of_the_dashboard_lists_the_relay_s_pods_too(worker_registry) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    [pod] = [choice for choice in dashboard["templating"]["list"] if choice["name"] == "pod"]
    read = set(METRIC_NAME.findall(pod["query"]["query"]))
    relay = RelayMetrics(RESULT_ROUTING_KEYS).registry

    assert read == {"fulfilment_build_info"}
    assert read <= exported_names(worker_registry)
    assert read <= exported_names(relay)
