"""The CloudNativePG Cluster (k8s/postgres-cluster.yaml) gives the guarantee of the failover
suite: three instances, a synchronous standby required for every commit, the worker, the
relay and the migration on the ``-rw`` Service, and the roles of "Least privilege".

No package on PyPI has models of CloudNativePG's CRDs (as cloudcoil has KEDA's and the
Prometheus Operator's), so :class:`Cluster` models the fields the manifest uses, with the
names, types and allowed values of CloudNativePG's API reference (``postgresql.cnpg.io/v1``),
and forbids any other: a misspelt or invented field fails here as it would in the cluster.
"""

from __future__ import annotations

import urllib.parse
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tests.deploy.stack import Stack, k8s_environment, load_stack, worker_deployment

STACK = load_stack()


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class SecretReference(Strict):
    name: str


class Synchronous(Strict):
    method: Literal["any", "first"]
    number: int = Field(ge=1)
    max_standby_names_from_cluster: int | None = Field(None, alias="maxStandbyNamesFromCluster")
    standby_names_pre: list[str] | None = Field(None, alias="standbyNamesPre")
    standby_names_post: list[str] | None = Field(None, alias="standbyNamesPost")
    data_durability: Literal["required", "preferred"] | None = Field(None, alias="dataDurability")


class PostgresConfiguration(Strict):
    synchronous: Synchronous | None = None
    parameters: dict[str, str] = Field(default_factory=dict)


class InitDb(Strict):
    database: str
    owner: str
    secret: SecretReference | None = None


class Bootstrap(Strict):
    initdb: InitDb


class Role(Strict):
    name: str
    ensure: Literal["present", "absent"] = "present"
    login: bool = False
    superuser: bool = False
    createdb: bool = False
    createrole: bool = False
    replication: bool = False
    bypassrls: bool = False
    inherit: bool = True
    connection_limit: int | None = Field(None, alias="connectionLimit")
    password_secret: SecretReference | None = Field(None, alias="passwordSecret")


class Managed(Strict):
    roles: list[Role]


class Storage(Strict):
    size: str
    storage_class: str | None = Field(None, alias="storageClass")


class Affinity(Strict):
    enable_pod_anti_affinity: bool | None = Field(None, alias="enablePodAntiAffinity")
    topology_key: str | None = Field(None, alias="topologyKey")
    pod_anti_affinity_type: Literal["preferred", "required"] | None = Field(
        None, alias="podAntiAffinityType"
    )


class Resources(Strict):
    requests: dict[str, str] = Field(default_factory=dict)
    limits: dict[str, str] = Field(default_factory=dict)


class ClusterSpec(Strict):
    instances: int = Field(ge=1)
    image_name: str | None = Field(None, alias="imageName")
    primary_update_strategy: Literal["unsupervised", "supervised"] | None = Field(
        None, alias="primaryUpdateStrategy"
    )
    primary_update_method: Literal["switchover", "restart"] | None = Field(
        None, alias="primaryUpdateMethod"
    )
    postgresql: PostgresConfiguration
    bootstrap: Bootstrap
    managed: Managed
    storage: Storage
    affinity: Affinity | None = None
    resources: Resources | None = None


class Metadata(Strict):
    name: str
    namespace: str
    labels: dict[str, str] = Field(default_factory=dict)


class Cluster(Strict):
    api_version: Literal["postgresql.cnpg.io/v1"] = Field(alias="apiVersion")
    kind: Literal["Cluster"]
    metadata: Metadata
    spec: ClusterSpec


def cluster_document(stack: Stack) -> dict[str, Any]:
    return stack.resource("Cluster", "postgres")


def database_url(stack: Stack, secret: str) -> urllib.parse.SplitResult:
    url = stack.resource("Secret", secret)["stringData"]["FULFILMENT_DATABASE_URL"]
    return urllib.parse.urlsplit(url)


def test_the_cluster_has_only_fields_of_the_crd():
    Cluster.model_validate(cluster_document(STACK))


def test_a_field_the_crd_does_not_have_is_caught():
    doc = STACK.copy().resource("Cluster", "postgres")
    doc["spec"]["postgresql"]["synchronous"]["durability"] = "required"
    with pytest.raises(ValidationError):
        Cluster.model_validate(doc)


def test_every_commit_waits_for_a_standby_of_three_instances():
    spec = Cluster.model_validate(cluster_document(STACK)).spec
    assert spec.instances == 3
    synchronous = spec.postgresql.synchronous
    assert synchronous is not None
    assert synchronous.data_durability == "required"
    # A standby must remain to confirm commits while another instance is down.
    assert 1 <= synchronous.number < spec.instances - 1
    assert spec.postgresql.parameters.get("synchronous_commit", "on") in {"on", "remote_apply"}


def test_the_service_reaches_the_primary_through_the_rw_service():
    doc = cluster_document(STACK)
    host = f"{doc['metadata']['name']}-rw.{doc['metadata']['namespace']}.svc"
    for secret in ("fulfilment", "fulfilment-owner"):
        assert database_url(STACK, secret).hostname == host, secret
    pod = worker_deployment(STACK)["spec"]["template"]["spec"]
    assert (
        urllib.parse.urlsplit(k8s_environment(STACK, pod)["FULFILMENT_DATABASE_URL"]).hostname
        == host
    )


def test_the_roles_are_those_of_least_privilege():
    spec = Cluster.model_validate(cluster_document(STACK)).spec
    owner = database_url(STACK, "fulfilment-owner").username
    runtime = database_url(STACK, "fulfilment").username
    assert spec.bootstrap.initdb.owner == owner
    assert spec.bootstrap.initdb.database == database_url(STACK, "fulfilment").path.lstrip("/")
    configured = STACK.resource("ConfigMap", "fulfilment")["data"]
    assert configured["FULFILMENT_DATABASE_RUNTIME_ROLE"] == runtime
    (role,) = [role for role in spec.managed.roles if role.name == runtime]
    assert role.login
    powers = ("superuser", "createdb", "createrole", "replication", "bypassrls")
    assert [power for power in powers if getattr(role, power)] == []
    for reference, user in (
        (spec.bootstrap.initdb.secret, owner),
        (role.password_secret, runtime),
    ):
        assert reference is not None
        secret = STACK.resource("Secret", reference.name)
        assert secret["type"] == "kubernetes.io/basic-auth"
        assert secret["stringData"]["username"] == user
