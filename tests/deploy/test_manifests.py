"""Every Kubernetes manifest validates against its schema, offline.

Built-in kinds are checked with kubernetes-validate's bundled (strict) schemas of the
Kubernetes versions below; the custom resources of KEDA and the Prometheus Operator with
the pydantic models generated from their CRDs (cloudcoil), read back to catch fields the
CRD does not have. The Messaging Topology Operator's Policy and the Cluster Operator's
RabbitmqCluster have no packaged schema: their fields are checked by
``stack.check_rabbitmq_policies``, ``stack.check_rabbitmq_cluster`` and (User, Permission)
``stack.check_broker_users``. CloudNativePG's Cluster has none on PyPI either: a pydantic model
of the fields the manifest uses checks it (``test_postgres_cluster``).
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from cloudcoil.models.keda.v1alpha1 import ScaledObject, TriggerAuthentication
from cloudcoil.models.prometheus_operator.v1 import PodMonitor, PrometheusRule

from tests.deploy.stack import Stack, load_stack

KUBERNETES_VERSIONS = ["1.30.0", "1.33.0"]
"""The oldest Kubernetes the manifests support (policy/v1, batch/v1 Job TTL, seccompProfile
fields, all older) and a current one."""

CUSTOM_RESOURCES: dict[tuple[str, str], Any] = {
    ("keda.sh/v1alpha1", "ScaledObject"): ScaledObject,
    ("keda.sh/v1alpha1", "TriggerAuthentication"): TriggerAuthentication,
    ("monitoring.coreos.com/v1", "PodMonitor"): PodMonitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PrometheusRule,
}
CHECKED_ELSEWHERE = {
    ("rabbitmq.com/v1beta1", "Policy"),
    ("rabbitmq.com/v1beta1", "RabbitmqCluster"),
    ("rabbitmq.com/v1beta1", "User"),
    ("rabbitmq.com/v1beta1", "Permission"),
    ("postgresql.cnpg.io/v1", "Cluster"),
}

STACK = load_stack()
DOCUMENTS = [
    (file, doc)
    for file, docs in STACK.k8s_files.items()
    for doc in docs
    if doc["kind"] != "Kustomization"
]


def _params(keep: Any) -> list[Any]:
    return [
        pytest.param(doc, id=f"{file}:{doc['kind']}/{doc['metadata']['name']}")
        for file, doc in DOCUMENTS
        if keep((doc["apiVersion"], doc["kind"]))
    ]


CUSTOM = _params(lambda key: key in CUSTOM_RESOURCES)
BUILT_IN = _params(lambda key: key not in CUSTOM_RESOURCES and key not in CHECKED_ELSEWHERE)


@pytest.fixture(scope="module")
def stack() -> Stack:
    return STACK


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("doc", BUILT_IN)
def test_built_in_kinds_validate_strictly(doc: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("doc", CUSTOM)
def test_custom_resources_match_their_crds(doc: dict[str, Any]) -> None:
    parsed = CUSTOM_RESOURCES[(doc["apiVersion"], doc["kind"])].model_validate(doc)
    # The models ignore unknown fields; reading the document back shows any that were dropped.
    assert parsed.model_dump(mode="json", by_alias=True, exclude_unset=True) == doc


def test_a_field_the_crd_does_not_have_is_caught(stack: Stack) -> None:
    doc = stack.copy().resource("ScaledObject", "fulfilment-worker")
    doc["spec"]["minReplicas"] = 2
    parsed = ScaledObject.model_validate(doc)
    assert parsed.model_dump(mode="json", by_alias=True, exclude_unset=True) != doc


def test_a_built_in_field_of_the_wrong_type_is_caught(stack: Stack) -> None:
    doc = stack.copy().resource("Deployment", "fulfilment-worker")
    doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "30"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES_VERSIONS[-1], strict=True)
