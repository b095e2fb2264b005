"""The Dockerfile, compose stack and Kubernetes manifests agree with the code.

Each rule of ``stack.py`` passes on the committed files; each deliberate break below (one
cross-file number or name changed in a copy) makes at least one rule fail, so a real change of
that kind fails CI.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.deploy.stack import CHECKS, Stack, all_problems, load_stack, problems_of


@pytest.fixture(scope="module")
def stack() -> Stack:
    return load_stack()


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_the_committed_files_pass(stack: Stack, check: Callable[[Stack], list[str]]) -> None:
    assert problems_of(check, stack) == []


def _container(stack: Stack, kind: str = "Deployment") -> dict[str, Any]:
    name = "fulfilment-worker" if kind == "Deployment" else "fulfilment-migrate"
    return stack.resource(kind, name)["spec"]["template"]["spec"]["containers"][0]


def _configmap(stack: Stack) -> dict[str, str]:
    return stack.resource("ConfigMap", "fulfilment")["data"]


def _dockerfile(stack: Stack, instruction: str, old: str, new: str) -> None:
    for item in stack.dockerfile:
        if item["instruction"] == instruction and old in item["value"]:
            item["value"] = item["value"].replace(old, new)
            return
    msg = f"no {instruction} with {old!r}"
    raise AssertionError(msg)


def _set(path: list[Any], value: Any) -> Callable[[Stack], None]:
    def mutate(stack: Stack) -> None:
        target: Any = stack
        for key in path[:-1]:
            target = (
                getattr(target, key)
                if isinstance(key, str) and hasattr(target, key)
                else target[key]
            )
        target[path[-1]] = value

    return mutate


def _pod(stack: Stack) -> dict[str, Any]:
    return stack.resource("Deployment", "fulfilment-worker")["spec"]["template"]["spec"]


BREAKS: dict[str, Callable[[Stack], None]] = {
    "grace period below the graceful timeout": lambda s: _pod(s).update(
        terminationGracePeriodSeconds=15
    ),
    "grace period not told to the worker": lambda s: _pod(s).update(
        terminationGracePeriodSeconds=45
    ),
    "graceful timeout above the grace period": lambda s: _configmap(s).update(
        FULFILMENT_GRACEFUL_TIMEOUT_SECONDS="35"
    ),
    "handler deadline above the graceful timeout": lambda s: _configmap(s).update(
        FULFILMENT_HANDLER_DEADLINE_SECONDS="25"
    ),
    "a variable the settings do not have": lambda s: _configmap(s).update(
        FULFILMENT_GRACEFUL_TIMEOUT="20"
    ),
    "a misspelt variable in compose": lambda s: s.compose["services"]["worker"][
        "environment"
    ].update(FULFILMENT_AMQP_URI="amqp://x@rabbitmq/"),
    "compose stops before the drain ends": _set(
        ["compose", "services", "worker", "stop_grace_period"], "10s"
    ),
    "compose stop signal": _set(["compose", "services", "worker", "stop_signal"], "SIGKILL"),
    "image stop signal": lambda s: _dockerfile(s, "STOPSIGNAL", "SIGTERM", "SIGQUIT"),
    "liveness probe path that does not exist": lambda s: _container(s)["livenessProbe"][
        "httpGet"
    ].update(path="/healthz"),
    "liveness probe on readiness": lambda s: _container(s)["livenessProbe"]["httpGet"].update(
        path="/health/ready"
    ),
    "readiness probe on liveness": lambda s: _container(s)["readinessProbe"]["httpGet"].update(
        path="/health/live"
    ),
    "probe port that is not the app's": lambda s: _container(s)["readinessProbe"]["httpGet"].update(
        port=9090
    ),
    "container port other than the app's": lambda s: _container(s)["ports"][0].update(
        containerPort=8081
    ),
    "app port moved without the container port": lambda s: _configmap(s).update(
        FULFILMENT_HTTP_PORT="9000"
    ),
    "readiness probe timeout shorter than its checks": lambda s: _container(s)[
        "readinessProbe"
    ].update(timeoutSeconds=2),
    "image exposes another port": lambda s: _dockerfile(s, "EXPOSE", "8080", "8000"),
    "image health check on a missing path": lambda s: _dockerfile(
        s, "HEALTHCHECK", "/health/live", "/health"
    ),
    "compose health check port": lambda s: s.compose["services"]["worker"]["healthcheck"][
        "test"
    ].__setitem__(
        -1, s.compose["services"]["worker"]["healthcheck"]["test"][-1].replace("8080", "8081")
    ),
    "pod monitor port name": lambda s: s.resource("PodMonitor", "fulfilment-worker")["spec"][
        "podMetricsEndpoints"
    ][0].update(port="metrics"),
    "pod monitor path": lambda s: s.resource("PodMonitor", "fulfilment-worker")["spec"][
        "podMetricsEndpoints"
    ][0].update(path="/prometheus"),
    "prometheus scrapes another port": lambda s: s.prometheus["scrape_configs"][0][
        "dns_sd_configs"
    ][0].update(port=9000),
    "delivery limit in the settings only": lambda s: _configmap(s).update(
        FULFILMENT_DELIVERY_LIMIT="7"
    ),
    "delivery limit in the compose policy only": lambda s: s.definitions["policies"][0][
        "definition"
    ].update({"delivery-limit": 20}),
    "delivery limit in the k8s policy only": lambda s: s.resource(
        "Policy", "fulfilment-order-placed"
    )["spec"]["definition"].update({"delivery-limit": 20}),
    "policy pattern for another queue": lambda s: s.resource("Policy", "fulfilment-order-placed")[
        "spec"
    ].update(pattern="^orders\\.order-placed$"),
    "policy pattern that also takes the DLQ": lambda s: s.definitions["policies"][0].update(
        pattern="^fulfilment\\.order-placed"
    ),
    "policy with another dead-letter exchange": lambda s: s.definitions["policies"][0][
        "definition"
    ].update({"dead-letter-exchange": "dlx"}),
    "policy field the operator does not know": lambda s: s.resource(
        "Policy", "fulfilment-order-placed"
    )["spec"].update(apply_to="queues"),
    "cluster replicas other than the group size": lambda s: s.resource(
        "RabbitmqCluster", "rabbitmq"
    )["spec"].update(replicas=5),
    "group size in the settings only": lambda s: _configmap(s).update(
        FULFILMENT_QUORUM_INITIAL_GROUP_SIZE="5"
    ),
    "a cluster field the operator does not know": lambda s: s.resource(
        "RabbitmqCluster", "rabbitmq"
    )["spec"].update(nodes=3),
    "policy on another cluster": lambda s: s.resource("Policy", "fulfilment-order-placed")["spec"][
        "rabbitmqClusterReference"
    ].update(name="rabbit"),
    "broker URL past the cluster's Service": lambda s: s.resource("Secret", "fulfilment")[
        "stringData"
    ].update(FULFILMENT_AMQP_URL="amqps://u:p@rabbitmq.rabbitmq.svc:5671/"),
    "cluster consumer timeout below the assumed one": lambda s: s.resource(
        "RabbitmqCluster", "rabbitmq"
    )["spec"]["rabbitmq"].update(additionalConfig="consumer_timeout = 5000\n"),
    "a compose node left out of the cluster": lambda s: s.rabbitmq_conf.pop(
        "cluster_formation.classic_config.nodes.3"
    ),
    "a compose node the proxy does not know": lambda s: setattr(
        s, "haproxy_cfg", s.haproxy_cfg.replace("rabbitmq-3:5672", "rabbitmq-4:5672")
    ),
    "compose partitions handled otherwise": lambda s: s.rabbitmq_conf.update(
        cluster_partition_handling="autoheal"
    ),
    "broker consumer timeout below the assumed one": lambda s: s.rabbitmq_conf.update(
        consumer_timeout="5000"
    ),
    "scaling on another queue": lambda s: s.resource("ScaledObject", "fulfilment-worker")["spec"][
        "triggers"
    ][0]["metadata"].update(queueName="fulfilment.order-placed.dlq"),
    "no scaling on a queue the worker consumes": lambda s: s.resource(
        "ScaledObject", "fulfilment-worker"
    )["spec"]["triggers"].pop(),
    "a new queue without its policy": lambda s: s.definitions["policies"].pop(),
    "a new queue's policy with the first queue's dead-letter routing key": lambda s: s.resource(
        "Policy", "fulfilment-order-shipped"
    )["spec"]["definition"].update({"dead-letter-routing-key": "fulfilment.order-placed"}),
    "a new dead-letter queue without its limit": lambda s: s.resource(
        "Policy", "fulfilment-order-cancelled-dlq"
    )["spec"]["definition"].pop("delivery-limit"),
    "a broker that takes larger bodies than the worker": lambda s: s.rabbitmq_conf.update(
        max_message_size="134217728"
    ),
    "a cluster without a message size limit": lambda s: s.resource("RabbitmqCluster", "rabbitmq")[
        "spec"
    ]["rabbitmq"].update(additionalConfig="consumer_timeout = 1800000\n"),
    "a dead-letter queue kept longer than the processed ids": lambda s: s.resource(
        "Policy", "fulfilment-order-placed-dlq"
    )["spec"]["definition"].update({"message-ttl": 40 * 86_400_000}),
    "scaling another deployment": lambda s: s.resource("ScaledObject", "fulfilment-worker")["spec"][
        "scaleTargetRef"
    ].update(name="fulfilment"),
    "disruption budget as large as the minimum": lambda s: s.resource(
        "PodDisruptionBudget", "fulfilment-worker"
    )["spec"].update(minAvailable=2),
    "more replicas than the database has connections": lambda s: s.resource(
        "ScaledObject", "fulfilment-worker"
    )["spec"].update(maxReplicaCount=30),
    "scaling target below the prefetch": lambda s: s.resource("ScaledObject", "fulfilment-worker")[
        "spec"
    ]["triggers"][0]["metadata"].update(value="10"),
    "a job that runs no command": lambda s: _container(s, "Job").update(args=["migrations"]),
    "a worker that runs as root": lambda s: _pod(s)["securityContext"].update(runAsUser=0),
    "a writable root filesystem": lambda s: _container(s)["securityContext"].update(
        readOnlyRootFilesystem=False
    ),
    "image of another release": lambda s: _container(s).update(
        image="registry.example.com/fulfilment:0.0.9"
    ),
    "install that may re-resolve": lambda s: _dockerfile(
        s, "RUN", "uv sync --frozen --no-dev --no-editable", "uv sync --no-dev --no-editable"
    ),
    "install with the dev tools": lambda s: _dockerfile(
        s,
        "RUN",
        "uv sync --frozen --no-dev --no-install-project",
        "uv sync --frozen --no-install-project",
    ),
    "migrations where migrate does not look": lambda s: _dockerfile(
        s, "COPY", "migrations ./migrations", "migrations ./alembic"
    ),
    "another uv than the Makefile's": lambda s: _dockerfile(s, "RUN", "uv==", "uv==0.0.1 #"),
    "rules changed without rendering": lambda s: s.alerts["groups"][0]["rules"][0].update(
        {"for": "1m"}
    ),
    "a manifest left out of the kustomization": lambda s: s.kustomization["resources"].remove(
        "podmonitor.yaml"
    ),
    "worker started before the migration": lambda s: s.compose["services"]["worker"][
        "depends_on"
    ].pop("migrate"),
    "a worker with the owner's secret": lambda s: _container(s)["envFrom"][1]["secretRef"].update(
        name="fulfilment-owner"
    ),
    "a migration Job with the runtime role's secret": lambda s: _container(s, "Job")["envFrom"][1][
        "secretRef"
    ].update(name="fulfilment"),
    "grants to another role than the worker's": lambda s: _configmap(s).update(
        FULFILMENT_DATABASE_RUNTIME_ROLE="fulfilment_worker"
    ),
    "a compose relay as the superuser": lambda s: (
        s.compose["services"]["relay"]
        .setdefault("environment", {})
        .update(FULFILMENT_DATABASE_URL="postgresql://postgres@postgres:5432/fulfilment")
    ),
    "a compose role no init script creates": lambda s: s.compose["services"]["migrate"][
        "environment"
    ].update(FULFILMENT_DATABASE_URL="postgresql://fulfilment_admin@postgres:5432/fulfilment"),
    "grafana provider path not mounted": lambda s: s.grafana_dashboards["providers"][0][
        "options"
    ].update(path="/var/lib/grafana/dashboards"),
    "KEDA with the worker's credentials": lambda s: s.resource(
        "TriggerAuthentication", "fulfilment-rabbitmq"
    )["spec"].update(
        secretTargetRef=[{"parameter": "host", "name": "fulfilment", "key": "FULFILMENT_AMQP_URL"}]
    ),
    "guest back as an administrator": lambda s: s.definitions["users"].append(
        {"name": "guest", "password_hash": "x", "tags": ["administrator"]}
    ),
    "a k8s permission wider than the definitions'": lambda s: s.resource(
        "Permission", "fulfilment"
    )["spec"]["permissions"].update(configure=".*"),
    "the broker's CA not mounted in the relay": lambda s: s.resource(
        "Deployment", "fulfilment-relay"
    )["spec"]["template"]["spec"]["containers"][0]["volumeMounts"].pop(),
    "the dispatcher's port moved in the ConfigMap only": lambda s: _configmap(s).update(
        FULFILMENT_DISPATCHER_PORT="9082"
    ),
    "the dispatcher without its URL": lambda s: _configmap(s).pop("FULFILMENT_WAREHOUSE_URL"),
    "the compose dispatcher's healthcheck on the relay's port": lambda s: s.compose["services"][
        "dispatcher"
    ]["healthcheck"].update(
        test=[
            "CMD",
            "python",
            "-c",
            "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8081/health/ready')",
        ]
    ),
    "Prometheus scraping the dispatcher on another port": lambda s: next(
        job for job in s.prometheus["scrape_configs"] if job["job_name"] == "fulfilment-dispatcher"
    )["dns_sd_configs"][0].update(port=9999),
    "the intake's endpoint port moved in the ConfigMap only": lambda s: _configmap(s).update(
        FULFILMENT_WEBHOOKS_PORT="9083"
    ),
    "the intake without its secrets": lambda s: s.resource("Secret", "fulfilment-webhooks")[
        "stringData"
    ].update(FULFILMENT_WAREHOUSE_WEBHOOK_SECRETS=""),
    "the intake's Service forwarding /metrics too": lambda s: s.resource(
        "Service", "fulfilment-webhooks"
    )["spec"]["ports"].append({"name": "http", "port": 8084, "targetPort": "http"}),
    "the Ingress exposing every path": lambda s: s.resource("Ingress", "fulfilment-webhooks")[
        "spec"
    ]["rules"][0]["http"]["paths"][0].update(path="/", pathType="Prefix"),
    "the Ingress without TLS": lambda s: s.resource("Ingress", "fulfilment-webhooks")["spec"].pop(
        "tls"
    ),
    "one intake replica": lambda s: s.resource("Deployment", "fulfilment-webhooks")["spec"].update(
        replicas=1
    ),
    "the intake probed on its endpoint's port": lambda s: _webhooks_container(s)["readinessProbe"][
        "httpGet"
    ].update(port="webhooks"),
    "the intake as the owner role": lambda s: _webhooks_container(s)["env"][0]["valueFrom"][
        "secretKeyRef"
    ].update(name="fulfilment-owner"),
    "the simulator sending its webhooks to the probes' port": lambda s: _simulator_option(
        s, "--webhook-url", "http://webhooks:8084/webhooks/warehouse"
    ),
    "the simulator signing with a secret the intake does not hold": lambda s: s.compose["services"][
        "warehouse"
    ]["command"].extend(["--webhook-secret", "whsec_c29tZXRoaW5nLWVsc2U="]),
    "Prometheus scraping the intake's endpoint port": lambda s: next(
        job for job in s.prometheus["scrape_configs"] if job["job_name"] == "fulfilment-webhooks"
    )["dns_sd_configs"][0].update(port=8083),
}


def _simulator_option(stack: Stack, option: str, value: str) -> None:
    command = stack.compose["services"]["warehouse"]["command"]
    command[command.index(option) + 1] = value


def _webhooks_container(stack: Stack) -> dict[str, Any]:
    deployment = stack.resource("Deployment", "fulfilment-webhooks")
    return deployment["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("mutate", BREAKS.values(), ids=BREAKS.keys())
def test_a_broken_number_fails_a_rule(stack: Stack, mutate: Callable[[Stack], None]) -> None:
    broken = stack.copy()
    mutate(broken)
    problems = all_problems(broken)
    # Caught by a rule that names the disagreement, not only by a rule that could not read.
    assert any("cannot read the files" not in problem for problem in problems), problems
