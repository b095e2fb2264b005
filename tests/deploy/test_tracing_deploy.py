"""Where the traces go: the deployment files and the example collector agree.

The worker, the relay and the dispatcher export OTLP/HTTP (port 4318, no gRPC) to the
collector named by ``OTEL_EXPORTER_OTLP_ENDPOINT``; the collector's pipeline only uses what it
defines; nothing waits for the collector; the sampler the manifests name is one the SDK reads
as meant.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from opentelemetry.sdk.trace import TracerProvider

from tests.deploy.stack import ROOT, load_stack

STACK = load_stack()
COLLECTOR = yaml.safe_load((ROOT / "deploy/otel/collector.yaml").read_text())
TRACED = ("worker", "relay", "dispatcher")
"""The compose services that export traces."""


def collector_http_port() -> int:
    endpoint = COLLECTOR["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    return int(endpoint.rsplit(":", 1)[1])


def compose_environment(service: str) -> dict[str, Any]:
    return dict(STACK.compose["services"][service].get("environment", {}))


def test_the_collector_pipeline_uses_only_what_it_defines() -> None:
    pipeline = COLLECTOR["service"]["pipelines"]["traces"]
    for section in ("receivers", "processors", "exporters"):
        assert set(pipeline[section]) <= set(COLLECTOR[section]), section
    assert set(COLLECTOR["service"]["extensions"]) <= set(COLLECTOR["extensions"])


def test_the_collector_receives_otlp_over_http_only() -> None:
    assert set(COLLECTOR["receivers"]["otlp"]["protocols"]) == {"http"}
    assert collector_http_port() == 4318


@pytest.mark.parametrize("service", TRACED)
def test_compose_services_export_to_the_collector_that_mounts_the_example(service: str) -> None:
    endpoint = urlsplit(compose_environment(service)["OTEL_EXPORTER_OTLP_ENDPOINT"])
    collector = STACK.compose["services"][endpoint.hostname]
    assert any(
        volume.split(":")[0] == "./deploy/otel/collector.yaml" for volume in collector["volumes"]
    )
    assert endpoint.scheme == "http"
    assert endpoint.port == collector_http_port()
    assert str(endpoint.port) in collector["expose"]


@pytest.mark.parametrize("service", TRACED)
def test_nothing_waits_for_the_collector(service: str) -> None:
    collector = urlsplit(compose_environment(service)["OTEL_EXPORTER_OTLP_ENDPOINT"]).hostname
    assert collector not in STACK.compose["services"][service].get("depends_on", {})


def test_the_cluster_exports_to_the_collector_s_port() -> None:
    data = STACK.resource("ConfigMap", "fulfilment")["data"]
    endpoint = urlsplit(data["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert endpoint.scheme == "http"
    assert endpoint.port == collector_http_port()


@pytest.mark.parametrize(
    ("where", "environment", "description"),
    [
        ("compose", compose_environment("worker"), "ParentBased{root:AlwaysOnSampler"),
        (
            "k8s",
            STACK.resource("ConfigMap", "fulfilment")["data"],
            "ParentBased{root:TraceIdRatioBased{0.01}",
        ),
    ],
)
def test_the_sampler_is_one_the_sdk_reads_as_meant(
    where: str, environment: dict[str, Any], description: str, monkeypatch
) -> None:
    for name in ("OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"):
        monkeypatch.delenv(name, raising=False)
        if name in environment:
            monkeypatch.setenv(name, str(environment[name]))
    assert TracerProvider().sampler.get_description().startswith(description), where
