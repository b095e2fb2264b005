"""The deployment files, read into one object, and the rules that tie them to the code.

Every rule is a function ``check_*(stack) -> list[str]`` returning one line per problem (an
empty list when the files agree). The numbers they compare against are read from the code
(``Settings`` and its defaults, the topology's constants and queue arguments, the HTTP app's
behaviour, the CLI's commands), never copied into the tests. ``tests/deploy/test_agreement.py``
runs every rule on the real files, and on copies with one number broken.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import shlex
import tomllib
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer.main
import yaml
from dockerfile_parse import DockerfileParser
from pydantic import ValidationError

from fulfilment.adapters.postgres.engine import ENGINE_POOL_SIZE
from fulfilment.contracts.envelope import MAX_BODY_BYTES
from fulfilment.entrypoints import cli
from fulfilment.intake.app import WEBHOOK_PATH
from fulfilment.observability.metrics import Metrics
from fulfilment.routes.table import SUBSCRIBED_QUEUES
from fulfilment.settings import ENV_PREFIX, HttpSettings, Settings, from_variables, variables
from fulfilment.worker.health import READINESS_CHECK_SECONDS, health_app
from fulfilment.worker.topology import Topology
from warehouse_simulator.knobs import DEFAULT_WEBHOOK_SECRET

ROOT = Path(__file__).resolve().parents[2]

POSTGRES_DEFAULT_MAX_CONNECTIONS = 100
"""PostgreSQL's default ``max_connections``: the scaling bound must fit the workers' pools in it
(each replica holds ``database_pool_size`` + ``ENGINE_POOL_SIZE`` connections, no overflow)."""

QUEUE_ARGUMENT_TO_POLICY_KEY = {
    "x-delivery-limit": "delivery-limit",
    "x-dead-letter-exchange": "dead-letter-exchange",
    "x-dead-letter-routing-key": "dead-letter-routing-key",
    "x-dead-letter-strategy": "dead-letter-strategy",
    "x-overflow": "overflow",
}
"""Queue argument -> policy key of the same setting (RabbitMQ docs, "Policies")."""

# x-quorum-initial-group-size has no policy key: RabbitMQ reads it only when it creates a queue
# (3.10 knows "initial-cluster-size" for streams only, and refuses it on quorum queues).

POLICY_SPEC_FIELDS = {"name", "vhost", "pattern", "applyTo", "priority", "definition"}
POLICY_REQUIRED_FIELDS = {"name", "pattern", "definition", "rabbitmqClusterReference"}
POLICY_APPLY_TO = {"queues", "classic_queues", "quorum_queues", "streams", "exchanges", "all"}
"""The fields of the Messaging Topology Operator's ``Policy`` (rabbitmq.com/v1beta1) CRD."""

RABBITMQ_CLUSTER_FIELDS: dict[str, set[str]] = {
    "spec": {
        "replicas",
        "image",
        "imagePullSecrets",
        "service",
        "persistence",
        "resources",
        "affinity",
        "tolerations",
        "rabbitmq",
        "tls",
        "override",
        "skipPostDeploySteps",
        "terminationGracePeriodSeconds",
        "secretBackend",
    },
    "rabbitmq": {"additionalPlugins", "additionalConfig", "advancedConfig", "envConfig"},
    "tls": {"secretName", "caSecretName", "disableNonTLSListeners"},
    "persistence": {"storageClassName", "storage"},
    "service": {"type", "annotations"},
}
"""The fields of the Cluster Operator's ``RabbitmqCluster`` (rabbitmq.com/v1beta1) spec and of
its parts this repository sets (``RabbitmqClusterSpec`` of the operator's API): no package
ships a model of that CRD. ``affinity`` and ``resources`` are Kubernetes' own types."""

PARTITION_HANDLING = "pause_minority"
"""The partition handling of every broker the service is deployed with, and the one the
cluster suite (tests/cluster) proved."""


@dataclass
class Stack:
    """Every deployment file of the repository, parsed; tests mutate deep copies of it."""

    dockerfile: list[dict[str, Any]]
    dockerignore: list[str]
    compose: dict[str, Any]
    k8s: dict[tuple[str, str], dict[str, Any]]
    k8s_files: dict[str, list[dict[str, Any]]]
    kustomization: dict[str, Any]
    definitions: dict[str, Any]
    rabbitmq_conf: dict[str, str]
    haproxy_cfg: str
    prometheus: dict[str, Any]
    alerts: dict[str, Any]
    grafana_datasources: dict[str, Any]
    grafana_dashboards: dict[str, Any]
    makefile: str
    pyproject: dict[str, Any]

    def copy(self) -> Stack:
        return copy.deepcopy(self)

    def resource(self, kind: str, name: str) -> dict[str, Any]:
        return self.k8s[(kind, name)]


def load_stack(root: Path = ROOT) -> Stack:
    """Read and parse the deployment files under ``root``."""
    k8s: dict[tuple[str, str], dict[str, Any]] = {}
    k8s_files: dict[str, list[dict[str, Any]]] = {}
    for path in sorted((root / "k8s").glob("*.yaml")):
        documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        k8s_files[path.name] = documents
        for doc in documents:
            if doc.get("kind") != "Kustomization":
                k8s[(doc["kind"], doc["metadata"]["name"])] = doc
    parser = DockerfileParser(path=str(root / "Dockerfile"))
    conf = _conf_lines((root / "deploy/rabbitmq/rabbitmq.conf").read_text())
    return Stack(
        dockerfile=[i for i in parser.structure if i["instruction"] != "COMMENT"],
        dockerignore=(root / ".dockerignore").read_text().splitlines(),
        compose=yaml.safe_load((root / "docker-compose.yml").read_text()),
        k8s=k8s,
        k8s_files=k8s_files,
        kustomization=yaml.safe_load((root / "k8s/kustomization.yaml").read_text()),
        definitions=json.loads((root / "deploy/rabbitmq/definitions.json").read_text()),
        rabbitmq_conf=conf,
        haproxy_cfg=(root / "deploy/rabbitmq/haproxy.cfg").read_text(),
        prometheus=yaml.safe_load((root / "deploy/prometheus/prometheus.yml").read_text()),
        alerts=yaml.safe_load((root / "deploy/prometheus/alerts.yml").read_text()),
        grafana_datasources=yaml.safe_load(
            (root / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text()
        ),
        grafana_dashboards=yaml.safe_load(
            (root / "deploy/grafana/provisioning/dashboards/fulfilment.yml").read_text()
        ),
        makefile=(root / "Makefile").read_text(),
        pyproject=tomllib.loads((root / "pyproject.toml").read_text()),
    )


# --- reading the parsed files -------------------------------------------------------------


def is_setting(variable: str) -> bool:
    """Whether an environment variable sets one of the service's settings."""
    return variable.upper() in {name for _, _, name in variables()}


def effective_settings(environment: dict[str, Any]) -> Settings:
    """The settings a process would run with given ``environment`` (defaults for the rest).

    Raises:
        pydantic.ValidationError: the values do not validate (e.g. deadlines do not nest).
    """
    return from_variables(
        {name: str(value) for name, value in environment.items() if is_setting(name)}
    )


def dockerfile_stages(stack: Stack) -> list[list[dict[str, Any]]]:
    stages: list[list[dict[str, Any]]] = []
    for instruction in stack.dockerfile:
        if instruction["instruction"] == "FROM":
            stages.append([])
        stages[-1].append(instruction)
    return stages


def instructions(stage: list[dict[str, Any]], name: str) -> list[str]:
    return [i["value"] for i in stage if i["instruction"] == name]


def dockerfile_env(stage: list[dict[str, Any]]) -> dict[str, str]:
    env = {}
    for value in instructions(stage, "ENV"):
        for token in shlex.split(value):
            key, _, val = token.partition("=")
            env[key] = val
    return env


def exec_form(value: str) -> list[str]:
    parsed = json.loads(value)
    assert isinstance(parsed, list)
    return [str(part) for part in parsed]


def k8s_environment(stack: Stack, pod_spec: dict[str, Any]) -> dict[str, str]:
    """The environment of a pod's first container: its envFrom ConfigMaps and Secrets, then env.

    The Secret is the committed example (``secret.example.yaml``): the keys an operator must set;
    a variable taken from one key of it (``secretKeyRef``) is that key's value.
    """
    container = pod_spec["containers"][0]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(stack.resource("ConfigMap", source["configMapRef"]["name"])["data"])
        if "secretRef" in source:
            env.update(stack.resource("Secret", source["secretRef"]["name"])["stringData"])
    for item in container.get("env", []):
        reference = item.get("valueFrom", {}).get("secretKeyRef")
        env[item["name"]] = (
            stack.resource("Secret", reference["name"])["stringData"][reference["key"]]
            if reference is not None
            else item.get("value", "")
        )
    return env


def worker_deployment(stack: Stack) -> dict[str, Any]:
    return stack.resource("Deployment", "fulfilment-worker")


def migration_job(stack: Stack) -> dict[str, Any]:
    return stack.resource("Job", "fulfilment-migrate")


def duration_seconds(value: str) -> float:
    """A compose duration such as ``30s``, ``1m30s`` or ``1500ms``, in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", value)
    if not parts or "".join(n + u for n, u in parts) != value:
        msg = f"not a compose duration: {value!r}"
        raise ValueError(msg)
    return sum(float(number) * units[unit] for number, unit in parts)


def compose_environment(stack: Stack, service: str) -> dict[str, str]:
    return {k: str(v) for k, v in stack.compose["services"][service].get("environment", {}).items()}


def fulfilment_services(stack: Stack) -> list[str]:
    """Compose services that run the image built from the Dockerfile."""
    return [name for name, service in stack.compose["services"].items() if "build" in service]


# --- the HTTP app's behaviour, asked directly ---------------------------------------------


async def _get(path: str, *, healthy: bool) -> tuple[int, bytes]:
    async def broker_connected(_timeout: float) -> bool:
        return healthy

    async def database_ping() -> None:
        if not healthy:
            raise ConnectionRefusedError

    app = health_app(
        broker_connected=broker_connected,
        consumer_attached=lambda: healthy,
        database_ping=database_ping,
        registry=Metrics().registry,
    )
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8080),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return int(status), body


def http_get(path: str, *, healthy: bool) -> tuple[int, bytes]:
    """Status and body the worker's HTTP app answers for ``GET path``.

    ``healthy`` says whether the broker, the consumer and the database are all up (True) or
    all down (False).
    """
    return asyncio.run(_get(path, healthy=healthy))


def liveness_problems(where: str, path: str) -> list[str]:
    status, _ = http_get(path, healthy=False)
    if status != 200:
        return [
            (
                f"{where}: {path} answers {status} while the broker and database are down; "
                "a liveness check must answer 200 as long as the process serves HTTP"
            )
        ]
    return []


def readiness_problems(where: str, path: str) -> list[str]:
    up, _ = http_get(path, healthy=True)
    down, _ = http_get(path, healthy=False)
    if up != 200 or down < 500:
        return [
            (
                f"{where}: {path} answers {up} when all is up and {down} when the broker and "
                "database are down; a readiness check must answer 200, then 5xx"
            )
        ]
    return []


def metrics_problems(where: str, path: str) -> list[str]:
    status, body = http_get(path, healthy=True)
    if status != 200 or b"fulfilment_events_total" not in body:
        return [f"{where}: {path} does not serve the worker's Prometheus metrics ({status})"]
    return []


# --- the rules ----------------------------------------------------------------------------


def check_environment_variables_exist(stack: Stack) -> list[str]:
    """Every FULFILMENT_* variable that a deployment file sets is a field of ``Settings``."""
    sources: dict[str, dict[str, Any]] = {}
    for number, stage in enumerate(dockerfile_stages(stack)):
        sources[f"Dockerfile stage {number}"] = dockerfile_env(stage)
    for service in stack.compose["services"]:
        sources[f"docker-compose.yml {service}"] = compose_environment(stack, service)
    for (kind, name), doc in stack.k8s.items():
        if kind == "ConfigMap":
            sources[f"k8s ConfigMap {name}"] = doc["data"]
        if kind == "Secret":
            sources[f"k8s Secret {name}"] = doc["stringData"]
        if kind in {"Deployment", "Job"}:
            for container in doc["spec"]["template"]["spec"]["containers"]:
                env = {item["name"]: "" for item in container.get("env", [])}
                sources[f"k8s {kind} {name}"] = env
    for trigger in stack.resource("TriggerAuthentication", "fulfilment-rabbitmq")["spec"][
        "secretTargetRef"
    ]:
        sources["k8s TriggerAuthentication"] = {trigger["key"]: ""}
    return [
        f"{where}: {variable} is not a setting (src/fulfilment/settings/)"
        for where, env in sources.items()
        for variable in env
        if variable.startswith(ENV_PREFIX) and not is_setting(variable)
    ]


def check_settings_validate(stack: Stack) -> list[str]:
    """The environment of each deployed process gives settings the service accepts."""
    environments = {
        f"docker-compose.yml {service}": compose_environment(stack, service)
        for service in fulfilment_services(stack)
    }
    environments["k8s Deployment"] = k8s_environment(
        stack, worker_deployment(stack)["spec"]["template"]["spec"]
    )
    environments["k8s Job"] = k8s_environment(
        stack, migration_job(stack)["spec"]["template"]["spec"]
    )
    problems = []
    for where, env in environments.items():
        try:
            effective_settings(env)
        except ValidationError as error:
            problems.append(f"{where}: the worker would refuse to start: {error}")
    return problems


def _deadlines(where: str, settings: Settings, grace: float) -> list[str]:
    deadlines = settings.deadlines
    if deadlines.handler_deadline_seconds < deadlines.graceful_timeout_seconds < grace:
        return []
    return [
        (
            f"{where}: need handler deadline ({deadlines.handler_deadline_seconds:g} s)"
            f" < graceful timeout ({deadlines.graceful_timeout_seconds:g} s)"
            " < the orchestrator's grace period "
            f"({grace:g} s)"
        )
    ]


def check_kubernetes_grace_period(stack: Stack) -> list[str]:
    """handler deadline < graceful timeout < terminationGracePeriodSeconds, and the worker
    is told the real grace period (so its own start-up check means something)."""
    pod = worker_deployment(stack)["spec"]["template"]["spec"]
    grace = float(pod.get("terminationGracePeriodSeconds", 30))
    try:
        settings = effective_settings(k8s_environment(stack, pod))
    except ValidationError as error:
        return [f"k8s Deployment: invalid settings: {error}"]
    problems = _deadlines("k8s Deployment", settings, grace)
    if settings.deadlines.orchestrator_grace_period_seconds != grace:
        problems.append(
            f"k8s: FULFILMENT_ORCHESTRATOR_GRACE_PERIOD_SECONDS="
            f"{settings.deadlines.orchestrator_grace_period_seconds:g}"
            " but terminationGracePeriodSeconds "
            f"is {grace:g}"
        )
    return problems


def check_compose_grace_period(stack: Stack) -> list[str]:
    """The same nesting under docker compose, whose grace period is ``stop_grace_period``
    (10 s when unset), and both the image and compose stop the worker with SIGTERM."""
    worker = stack.compose["services"]["worker"]
    grace = duration_seconds(str(worker.get("stop_grace_period", "10s")))
    try:
        settings = effective_settings(compose_environment(stack, "worker"))
    except ValidationError as error:
        return [f"docker-compose.yml worker: invalid settings: {error}"]
    problems = _deadlines("docker-compose.yml worker", settings, grace)
    if settings.deadlines.orchestrator_grace_period_seconds != grace:
        problems.append(
            f"docker-compose.yml worker: FULFILMENT_ORCHESTRATOR_GRACE_PERIOD_SECONDS="
            f"{settings.deadlines.orchestrator_grace_period_seconds:g}"
            f" but stop_grace_period is {grace:g} s"
        )
    if worker.get("stop_signal", "SIGTERM") != "SIGTERM":
        problems.append("docker-compose.yml worker: stop_signal must be SIGTERM")
    runtime = dockerfile_stages(stack)[-1]
    if instructions(runtime, "STOPSIGNAL") != ["SIGTERM"]:
        problems.append("Dockerfile: STOPSIGNAL must be SIGTERM (the worker drains on it)")
    return problems


def check_ports(stack: Stack) -> list[str]:
    """Every port that reaches the HTTP server is the one the worker listens on."""
    problems = []
    default_port = HttpSettings.model_fields["http_port"].default
    runtime = dockerfile_stages(stack)[-1]
    image_port = int(dockerfile_env(runtime).get("FULFILMENT_HTTP_PORT", default_port))
    if instructions(runtime, "EXPOSE") != [str(image_port)]:
        problems.append(f"Dockerfile: EXPOSE {instructions(runtime, 'EXPOSE')} is not {image_port}")
    healthcheck = " ".join(instructions(runtime, "HEALTHCHECK"))
    fallback = re.search(r"get\('(?P<var>\w+)', '(?P<port>\d+)'\)", healthcheck)
    if (
        fallback is None
        or fallback["var"] != "FULFILMENT_HTTP_PORT"
        or int(fallback["port"]) != image_port
    ):
        problems.append(f"Dockerfile: HEALTHCHECK does not ask FULFILMENT_HTTP_PORT ({image_port})")

    compose_port = effective_settings(compose_environment(stack, "worker")).http.http_port
    compose_health = " ".join(stack.compose["services"]["worker"]["healthcheck"]["test"])
    found = re.search(r"http://127\.0\.0\.1:(\d+)/", compose_health)
    if found is None or int(found[1]) != compose_port:
        problems.append(f"docker-compose.yml worker: healthcheck port is not {compose_port}")
    if [str(p) for p in stack.compose["services"]["worker"].get("expose", [])] != [
        str(compose_port)
    ]:
        problems.append(f"docker-compose.yml worker: expose is not [{compose_port}]")
    scraped = [
        sd["port"]
        for job in stack.prometheus["scrape_configs"]
        if job["job_name"] == "fulfilment"
        for sd in job["dns_sd_configs"]
    ]
    if scraped != [compose_port]:
        problems.append(f"prometheus.yml: scrapes ports {scraped}, not [{compose_port}]")

    pod = worker_deployment(stack)["spec"]["template"]["spec"]
    k8s_port = effective_settings(k8s_environment(stack, pod)).http.http_port
    ports = {p.get("name"): p["containerPort"] for p in pod["containers"][0].get("ports", [])}
    if list(ports.values()) != [k8s_port]:
        problems.append(f"k8s Deployment: containerPort {list(ports.values())} is not {k8s_port}")
    for probe_name in ("livenessProbe", "readinessProbe"):
        port = pod["containers"][0][probe_name]["httpGet"]["port"]
        if ports.get(port, port) != k8s_port:
            problems.append(f"k8s Deployment: {probe_name} port {port!r} is not {k8s_port}")
    monitor = stack.resource("PodMonitor", "fulfilment-worker")["spec"]
    problems.extend(
        f"k8s PodMonitor: port {endpoint['port']!r} is not a container port of {k8s_port}"
        for endpoint in monitor["podMetricsEndpoints"]
        if ports.get(endpoint["port"]) != k8s_port
    )
    return problems


def check_http_paths(stack: Stack) -> list[str]:
    """Probes, health checks and scrapes ask paths that the worker serves, with the meaning
    they need: liveness answers while dependencies are down, readiness does not."""
    problems = []
    container = worker_deployment(stack)["spec"]["template"]["spec"]["containers"][0]
    problems += liveness_problems(
        "k8s livenessProbe", container["livenessProbe"]["httpGet"]["path"]
    )
    problems += readiness_problems(
        "k8s readinessProbe", container["readinessProbe"]["httpGet"]["path"]
    )
    runtime = dockerfile_stages(stack)[-1]
    healthcheck = " ".join(instructions(runtime, "HEALTHCHECK"))
    path = re.search(r"(/[\w/.-]*)'?, timeout", healthcheck)
    problems += (
        liveness_problems("Dockerfile HEALTHCHECK", path[1])
        if path
        else ["Dockerfile: HEALTHCHECK asks no path"]
    )
    compose_health = " ".join(stack.compose["services"]["worker"]["healthcheck"]["test"])
    path = re.search(r"http://127\.0\.0\.1:\d+(/[\w/.-]*)", compose_health)
    problems += (
        readiness_problems("docker-compose.yml worker healthcheck", path[1])
        if path
        else ["docker-compose.yml worker: healthcheck asks no path"]
    )
    for endpoint in stack.resource("PodMonitor", "fulfilment-worker")["spec"][
        "podMetricsEndpoints"
    ]:
        problems += metrics_problems("k8s PodMonitor", endpoint.get("path", "/metrics"))
    for job in stack.prometheus["scrape_configs"]:
        if job["job_name"] == "fulfilment":
            problems += metrics_problems("prometheus.yml", job.get("metrics_path", "/metrics"))
    return problems


def check_probe_timeouts(stack: Stack) -> list[str]:
    """The readiness probe waits longer than the readiness checks may take (broker, then
    database, each up to READINESS_CHECK_SECONDS)."""
    container = worker_deployment(stack)["spec"]["template"]["spec"]["containers"][0]
    timeout = container["readinessProbe"].get("timeoutSeconds", 1)
    if timeout <= 2 * READINESS_CHECK_SECONDS:
        return [
            (
                f"k8s readinessProbe: timeoutSeconds={timeout} would cut the checks short "
                f"(up to {2 * READINESS_CHECK_SECONDS:g} s)"
            )
        ]
    return []


def _policy_problems(where: str, policies: list[dict[str, Any]], settings: Settings) -> list[str]:
    """``policies``: dicts with ``pattern`` and ``definition`` (either file's shape).

    Every subscribed queue and every DLQ of the topology is governed by exactly one policy,
    which repeats the arguments the worker declares it with; a DLQ's also sets the
    ``message-ttl`` the settings state (``FULFILMENT_DEAD_LETTER_TTL_SECONDS``, in ms), which
    the processed-id retention must outlive.
    """
    problems = []
    topology = Topology(delivery_limit=settings.broker.delivery_limit)
    expected = {
        queue.name: {
            QUEUE_ARGUMENT_TO_POLICY_KEY[argument]: value
            for argument, value in (queue.arguments or {}).items()
            if argument in QUEUE_ARGUMENT_TO_POLICY_KEY
        }
        for subscribed in SUBSCRIBED_QUEUES
        for queue in (topology.queue(subscribed), topology.dead_letter_queue(subscribed))
    }
    for subscribed in SUBSCRIBED_QUEUES:
        expected[subscribed.dead_letter_queue]["message-ttl"] = round(
            settings.retention.dead_letter_ttl_seconds * 1000
        )
    for queue, definition in expected.items():
        matching = [p for p in policies if re.search(p["pattern"], queue)]
        if len(matching) != 1:
            problems.append(f"{where}: {len(matching)} policies match queue {queue!r}, want 1")
        elif matching[0]["definition"] != definition:
            problems.append(
                f"{where}: the policy of {queue!r} is {matching[0]['definition']}, "
                f"the service declares {definition}"
            )
    return problems


def check_rabbitmq_policies(stack: Stack) -> list[str]:
    """The broker policies (compose definitions and the k8s Policy objects) match the queues
    the worker declares, with the delivery limit each deployment configures."""
    compose = effective_settings(compose_environment(stack, "worker"))
    problems = _policy_problems(
        "deploy/rabbitmq/definitions.json", stack.definitions["policies"], compose
    )
    pod = worker_deployment(stack)["spec"]["template"]["spec"]
    k8s = effective_settings(k8s_environment(stack, pod))
    k8s_policies = [doc["spec"] for (kind, _), doc in stack.k8s.items() if kind == "Policy"]
    problems += _policy_problems("k8s Policy", k8s_policies, k8s)
    for spec in k8s_policies:
        unknown = set(spec) - POLICY_SPEC_FIELDS - {"rabbitmqClusterReference"}
        missing = POLICY_REQUIRED_FIELDS - set(spec)
        if unknown or missing or spec.get("applyTo", "all") not in POLICY_APPLY_TO:
            problems.append(f"k8s Policy {spec.get('name')}: unknown {unknown}, missing {missing}")
    return problems


def _conf_lines(text: str) -> dict[str, str]:
    """``key = value`` lines of a rabbitmq.conf text (comments and blank lines left out)."""
    conf = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            conf[key.strip()] = value.strip()
    return conf


def rabbitmq_cluster(stack: Stack) -> dict[str, Any]:
    (doc,) = [doc for (kind, _), doc in stack.k8s.items() if kind == "RabbitmqCluster"]
    return doc


def check_rabbitmq_cluster(stack: Stack) -> list[str]:
    """The RabbitmqCluster sets only fields its CRD has, runs as many nodes as each quorum
    queue has members, and is the broker the worker's URL, the policies and the settings name."""
    doc = rabbitmq_cluster(stack)
    spec = doc["spec"]
    problems = [
        f"k8s RabbitmqCluster: {part} has no field {field!r}"
        for part, fields in RABBITMQ_CLUSTER_FIELDS.items()
        for field in (spec if part == "spec" else spec.get(part, {}))
        if field not in fields
    ]
    pod = worker_deployment(stack)["spec"]["template"]["spec"]
    env = k8s_environment(stack, pod)
    settings = effective_settings(env)
    if spec.get("replicas", 1) != settings.broker.quorum_initial_group_size:
        problems.append(
            f"k8s: RabbitmqCluster replicas {spec.get('replicas', 1)} != "
            f"FULFILMENT_QUORUM_INITIAL_GROUP_SIZE {settings.broker.quorum_initial_group_size}: "
            "every node must hold a member of each queue"
        )
    name, namespace = doc["metadata"]["name"], doc["metadata"]["namespace"]
    for (kind, policy), policy_doc in stack.k8s.items():
        reference = (
            policy_doc["spec"].get("rabbitmqClusterReference", {}) if kind == "Policy" else {}
        )
        if kind == "Policy" and (
            reference.get("name") != name
            or reference.get("namespace", policy_doc["metadata"]["namespace"]) != namespace
        ):
            problems.append(f"k8s Policy {policy}: not on the RabbitmqCluster {namespace}/{name}")
    url = urllib.parse.urlsplit(env["FULFILMENT_AMQP_URL"])
    scheme = "amqps" if spec.get("tls", {}).get("secretName") else "amqp"
    if url.hostname != f"{name}.{namespace}.svc" or url.scheme != scheme:
        problems.append(
            f"k8s Secret: FULFILMENT_AMQP_URL reaches {url.scheme}://{url.hostname}, the "
            f"RabbitmqCluster's Service is {scheme}://{name}.{namespace}.svc"
        )
    conf = _conf_lines(spec.get("rabbitmq", {}).get("additionalConfig", ""))
    timeout = int(conf.get("consumer_timeout", "1800000")) / 1000
    if timeout != settings.deadlines.broker_consumer_timeout_seconds:
        problems.append(
            f"k8s RabbitmqCluster: consumer_timeout is {timeout:g} s, the worker assumes "
            f"{settings.deadlines.broker_consumer_timeout_seconds:g} s"
        )
    if conf.get("cluster_partition_handling") != PARTITION_HANDLING:
        problems.append(
            f"k8s RabbitmqCluster: cluster_partition_handling is not {PARTITION_HANDLING}"
        )
    return problems


def check_compose_rabbitmq_cluster(stack: Stack) -> list[str]:
    """Compose runs as many clustered nodes as each quorum queue has members, all behind the
    one address the workers use."""
    services = stack.compose["services"]
    nodes = sorted(
        service["hostname"]
        for name, service in services.items()
        if name.startswith("rabbitmq-") and "hostname" in service
    )
    problems = []
    settings = effective_settings(compose_environment(stack, "worker"))
    if len(nodes) != settings.broker.quorum_initial_group_size:
        problems.append(
            f"docker-compose.yml: {len(nodes)} RabbitMQ nodes, the worker declares queues of "
            f"{settings.broker.quorum_initial_group_size} members"
        )
    discovered = sorted(
        value.removeprefix("rabbit@")
        for key, value in stack.rabbitmq_conf.items()
        if key.startswith("cluster_formation.classic_config.nodes.")
    )
    if discovered != nodes:
        problems.append(
            f"deploy/rabbitmq/rabbitmq.conf: clusters {discovered}, compose runs nodes {nodes}"
        )
    proxied = sorted(
        re.findall(r"^\s*server \S+ ([\w.-]+):5672\b", stack.haproxy_cfg, re.MULTILINE)
    )
    if proxied != nodes:
        problems.append(f"deploy/rabbitmq/haproxy.cfg: proxies {proxied}, compose runs {nodes}")
    host = urllib.parse.urlsplit(compose_environment(stack, "worker")["FULFILMENT_AMQP_URL"])
    if host.hostname != "rabbitmq" or "haproxy.cfg" not in str(services["rabbitmq"]["volumes"]):
        problems.append(
            "docker-compose.yml worker: FULFILMENT_AMQP_URL is not the proxy `rabbitmq`"
        )
    if stack.rabbitmq_conf.get("cluster_partition_handling") != PARTITION_HANDLING:
        problems.append(
            f"deploy/rabbitmq/rabbitmq.conf: cluster_partition_handling is not {PARTITION_HANDLING}"
        )
    return problems


def check_message_size(stack: Stack) -> list[str]:
    """Both brokers refuse a message body larger than the worker accepts, and no smaller one.

    ``max_message_size`` of deploy/rabbitmq/rabbitmq.conf and of the RabbitmqCluster's
    configuration equals ``MAX_BODY_BYTES`` (``contracts.envelope``): a producer learns of an
    oversized event when it publishes, and the broker never holds one the worker would refuse.
    """
    problems = []
    k8s_conf = _conf_lines(
        rabbitmq_cluster(stack)["spec"].get("rabbitmq", {}).get("additionalConfig", "")
    )
    for where, conf in (
        ("deploy/rabbitmq/rabbitmq.conf", stack.rabbitmq_conf),
        ("k8s RabbitmqCluster", k8s_conf),
    ):
        size = conf.get("max_message_size")
        if size is None or int(size) != MAX_BODY_BYTES:
            problems.append(
                f"{where}: max_message_size is {size}, the worker accepts bodies up to "
                f"{MAX_BODY_BYTES} bytes (MAX_BODY_BYTES)"
            )
    return problems


def check_broker_consumer_timeout(stack: Stack) -> list[str]:
    """The compose broker's consumer_timeout is the one the worker is told about."""
    settings = effective_settings(compose_environment(stack, "worker"))
    configured = int(stack.rabbitmq_conf.get("consumer_timeout", "1800000")) / 1000
    if configured != settings.deadlines.broker_consumer_timeout_seconds:
        return [
            (
                f"deploy/rabbitmq/rabbitmq.conf: consumer_timeout is {configured:g} s, the worker "
                f"assumes {settings.deadlines.broker_consumer_timeout_seconds:g} s"
            )
        ]
    return []


def check_scaling(stack: Stack) -> list[str]:
    """KEDA scales the worker Deployment on its queues (one trigger per subscribed queue, none
    on a DLQ), within bounds that the disruption budget and the database's connections
    allow."""
    problems = []
    deployment = worker_deployment(stack)
    pod = deployment["spec"]["template"]["spec"]
    settings = effective_settings(k8s_environment(stack, pod))
    scaled = stack.resource("ScaledObject", "fulfilment-worker")["spec"]
    pdb = stack.resource("PodDisruptionBudget", "fulfilment-worker")["spec"]
    low, high = scaled["minReplicaCount"], scaled["maxReplicaCount"]
    if scaled["scaleTargetRef"]["name"] != deployment["metadata"]["name"]:
        problems.append("k8s ScaledObject: scaleTargetRef is not the worker Deployment")
    if deployment["spec"]["replicas"] != low:
        problems.append(
            f"k8s: Deployment replicas {deployment['spec']['replicas']} != minReplicaCount {low}"
        )
    if not 1 <= pdb["minAvailable"] < low <= high:
        problems.append(
            f"k8s: need 1 <= PDB minAvailable ({pdb['minAvailable']}) < minReplicaCount "
            f"({low}) <= maxReplicaCount ({high})"
        )
    per_replica = settings.database.pool_size + ENGINE_POOL_SIZE
    if high * per_replica > POSTGRES_DEFAULT_MAX_CONNECTIONS:
        problems.append(
            f"k8s: {high} replicas x {per_replica} connections exceed "
            f"PostgreSQL's {POSTGRES_DEFAULT_MAX_CONNECTIONS}"
        )
    labels = pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for where, selector in {
        "Deployment": deployment["spec"]["selector"]["matchLabels"],
        "PodDisruptionBudget": pdb["selector"]["matchLabels"],
        "PodMonitor": stack.resource("PodMonitor", "fulfilment-worker")["spec"]["selector"][
            "matchLabels"
        ],
    }.items():
        if not selector.items() <= labels.items():
            problems.append(
                f"k8s {where}: selector {selector} does not match the pods {pod_labels}"
            )
    problems += _trigger_problems(stack, scaled["triggers"], settings.worker.prefetch_count)
    return problems


def _trigger_problems(
    stack: Stack, triggers: list[dict[str, Any]], prefetch_count: int
) -> list[str]:
    """One KEDA trigger per subscribed queue, each above the prefetch, with the broker's URL."""
    problems = []
    subscribed = [queue.name for queue in SUBSCRIBED_QUEUES]
    triggered = [trigger["metadata"].get("queueName") for trigger in triggers]
    if sorted(triggered) != sorted(subscribed):
        problems.append(
            f"k8s ScaledObject: triggers on queues {triggered}, the worker consumes {subscribed}"
        )
    for trigger in triggers:
        metadata = trigger["metadata"]
        if trigger["type"] != "rabbitmq":
            problems.append(
                f"k8s ScaledObject: trigger on {metadata.get('queueName')} is not rabbitmq"
            )
        if metadata.get("mode") != "QueueLength" or int(metadata.get("value", 0)) < prefetch_count:
            problems.append(
                f"k8s ScaledObject: target {metadata.get('value')} ready messages per replica is "
                f"below the prefetch ({prefetch_count})"
            )
        auth = stack.resource("TriggerAuthentication", trigger["authenticationRef"]["name"])
        problems += _keda_auth_problems(stack, auth)
    return problems


def _secret_value(stack: Stack, name: str, key: str) -> str | None:
    doc = stack.k8s.get(("Secret", name))
    return None if doc is None else doc["stringData"].get(key)


def _keda_auth_problems(stack: Stack, auth: dict[str, Any]) -> list[str]:
    """KEDA logs in as the definitions' monitoring user, never with the service's Secret, to
    the worker's broker, with TLS and a CA when the worker's URL is ``amqps://``."""
    refs = {ref["parameter"]: ref for ref in auth["spec"]["secretTargetRef"]}
    problems = [
        f"k8s TriggerAuthentication: {parameter} comes from the service's Secret fulfilment"
        for parameter, ref in refs.items()
        if ref["name"] == "fulfilment"
    ]
    values = {
        parameter: _secret_value(stack, ref["name"], ref["key"]) for parameter, ref in refs.items()
    }
    problems += [
        f"k8s TriggerAuthentication: {parameter} is no key of an example Secret"
        for parameter, value in values.items()
        if value is None
    ]
    host = urllib.parse.urlsplit(values.get("host") or "")
    monitoring = [u["name"] for u in stack.definitions["users"] if "monitoring" in u["tags"]]
    if host.username not in monitoring:
        problems.append(
            f"k8s TriggerAuthentication: KEDA logs in as {host.username!r}, not the monitoring"
            f" user of the definitions ({monitoring})"
        )
    pod = worker_deployment(stack)["spec"]["template"]["spec"]
    worker = urllib.parse.urlsplit(k8s_environment(stack, pod)["FULFILMENT_AMQP_URL"])
    if (host.scheme, host.hostname, host.port) != (worker.scheme, worker.hostname, worker.port):
        problems.append(
            f"k8s TriggerAuthentication: KEDA reaches {host.scheme}://{host.hostname}:{host.port},"
            f" the worker {worker.scheme}://{worker.hostname}:{worker.port}"
        )
    if worker.scheme == "amqps" and (values.get("tls") != "enable" or not values.get("ca")):
        problems.append("k8s TriggerAuthentication: amqps without tls=enable and a ca")
    return problems


def _permissions(definitions: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """User -> tags and (configure, write, read) on ``/``, from the definitions' shape."""
    return {
        user["name"]: {
            "tags": sorted(user["tags"]),
            "permissions": next(
                (
                    (p["configure"], p["write"], p["read"])
                    for p in definitions["permissions"]
                    if p["user"] == user["name"] and p["vhost"] == "/"
                ),
                None,
            ),
        }
        for user in definitions["users"]
    }


USER_SPEC_FIELDS = {"tags", "importCredentialsSecret", "rabbitmqClusterReference"}
PERMISSION_SPEC_FIELDS = {
    "vhost",
    "user",
    "userReference",
    "permissions",
    "rabbitmqClusterReference",
}
"""The fields of the Messaging Topology Operator's ``User`` and ``Permission`` CRDs
(rabbitmq.com/v1beta1) that this repository may set."""


def _k8s_grants(stack: Stack) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """What the k8s User and Permission objects grant, in :func:`_permissions`' shape (the
    user name from each User's credentials Secret), and the problems of their fields."""
    problems = []
    users = {
        doc["metadata"]["name"]: doc["spec"]
        for (kind, _), doc in stack.k8s.items()
        if kind == "User"
    }
    granted: dict[str, dict[str, Any]] = {}
    for (kind, name), doc in stack.k8s.items():
        fields = {"User": USER_SPEC_FIELDS, "Permission": PERMISSION_SPEC_FIELDS}.get(kind)
        if fields is None:
            continue
        spec = doc["spec"]
        if set(spec) - fields:
            problems.append(f"k8s {kind} {name}: unknown fields {sorted(set(spec) - fields)}")
        if kind != "Permission":
            continue
        user = users[spec["userReference"]["name"]]
        username = _secret_value(stack, user["importCredentialsSecret"]["name"], "username")
        rights = spec["permissions"]
        granted[str(username)] = {
            "tags": sorted(user.get("tags", [])),
            "permissions": (rights["configure"], rights["write"], rights["read"]),
        }
        if spec["vhost"] != "/":
            problems.append(f"k8s Permission {name}: vhost {spec['vhost']!r}, the definitions' /")
    return granted, problems


def check_broker_users(stack: Stack) -> list[str]:
    """The broker's users: no ``guest`` and no administrator in the definitions; the service's
    URLs (compose and k8s) log in as the user without tags; the k8s User and Permission objects
    grant exactly what the definitions grant; the worker's and the relay's pods mount the CA
    file the k8s broker URL names."""
    problems = []
    wanted = _permissions(stack.definitions)
    for name, user in wanted.items():
        if name == "guest" or "administrator" in user["tags"]:
            problems.append(f"deploy/rabbitmq/definitions.json: user {name!r} {user['tags']}")
    service = [name for name, user in wanted.items() if not user["tags"]]
    pod = worker_deployment(stack)["spec"]["template"]["spec"]
    k8s_url = urllib.parse.urlsplit(k8s_environment(stack, pod)["FULFILMENT_AMQP_URL"])
    compose_url = urllib.parse.urlsplit(compose_environment(stack, "worker")["FULFILMENT_AMQP_URL"])
    for where, url in (("docker-compose.yml", compose_url), ("k8s Secret", k8s_url)):
        if [url.username] != service:
            problems.append(
                f"{where}: FULFILMENT_AMQP_URL logs in as {url.username!r}, not {service}"
            )
    granted, grant_problems = _k8s_grants(stack)
    problems += grant_problems
    if granted != wanted:
        problems.append(f"k8s User/Permission grant {granted}, the definitions {wanted}")
    cafile = urllib.parse.parse_qs(k8s_url.query).get("cafile", [""])[0]
    for deployment in ("fulfilment-worker", "fulfilment-relay"):
        spec = stack.resource("Deployment", deployment)["spec"]["template"]["spec"]
        mounts = [m["mountPath"] for c in spec["containers"] for m in c.get("volumeMounts", [])]
        if cafile and not any(cafile.startswith(path.rstrip("/") + "/") for path in mounts):
            problems.append(f"k8s Deployment {deployment}: mounts no folder of cafile {cafile}")
    return problems


def check_commands_and_image(stack: Stack) -> list[str]:
    """Images run the console script with existing sub-commands, as the image's user."""
    problems = []
    commands = set(typer.main.get_command(cli.app).commands)
    scripts = stack.pyproject["project"]["scripts"]
    runtime = dockerfile_stages(stack)[-1]
    entrypoint = exec_form(instructions(runtime, "ENTRYPOINT")[0])
    if entrypoint[0] not in scripts or len(entrypoint) != 1:
        problems.append(f"Dockerfile: ENTRYPOINT {entrypoint} is not the console script")
    if exec_form(instructions(runtime, "CMD")[0]) != ["worker"]:
        problems.append("Dockerfile: CMD must be the worker")
    user = instructions(runtime, "USER")
    uid = user[0].split(":")[0] if user else "0"
    if not uid.isdigit() or int(uid) == 0:
        problems.append(f"Dockerfile: USER {user} is not a numeric non-root user")
    args = {
        "docker-compose.yml migrate": (stack.compose["services"]["migrate"]["command"], "migrate"),
        "docker-compose.yml worker": (stack.compose["services"]["worker"]["command"], "worker"),
    }
    version = stack.pyproject["project"]["version"]
    for doc, wanted in ((worker_deployment(stack), "worker"), (migration_job(stack), "migrate")):
        pod = doc["spec"]["template"]["spec"]
        container = pod["containers"][0]
        where = f"k8s {doc['kind']}"
        args[where] = (container.get("args"), wanted)
        if not container["image"].endswith(f":{version}"):
            problems.append(f"{where}: image {container['image']} is not release {version}")
        security = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
        if str(security.get("runAsUser")) != uid or not security.get("runAsNonRoot"):
            problems.append(f"{where}: must run as the image's user {uid}, non-root")
        if security.get("allowPrivilegeEscalation") is not False or not security.get(
            "readOnlyRootFilesystem"
        ):
            problems.append(
                f"{where}: needs allowPrivilegeEscalation false, readOnlyRootFilesystem"
            )
    for where, (given, wanted) in args.items():
        if given != [wanted] or wanted not in commands:
            problems.append(f"{where}: runs {given}, want [{wanted!r}] (a `fulfilment` command)")
    problems.extend(
        f"k8s/kustomization.yaml: newTag {image.get('newTag')} is not {version}"
        for image in stack.kustomization.get("images", [])
        if image.get("newTag") != version
    )
    return problems


def check_image_build(stack: Stack) -> list[str]:
    """The image installs from the lock file without dev tools, with the Makefile's uv, and
    puts the migrations where ``fulfilment migrate`` looks for them."""
    problems = []
    stages = dockerfile_stages(stack)
    bases = {stage[0]["value"].split()[0] for stage in stages}
    if len(bases) != 1 or "@sha256:" not in next(iter(bases)):
        problems.append(f"Dockerfile: stages must share one base pinned by digest, found {bases}")
    runs = [run for stage in stages for run in instructions(stage, "RUN")]
    syncs = [run for run in runs if "uv sync" in run]
    if not syncs or any("--frozen" not in run or "--no-dev" not in run for run in syncs):
        problems.append("Dockerfile: every `uv sync` needs --frozen and --no-dev")
    uv_version = re.search(r"^UV_VERSION := (\S+)$", stack.makefile, re.MULTILINE)
    pinned = [re.search(r"uv==(\S+)", run) for run in runs]
    if uv_version is None or [m[1] for m in pinned if m] != [uv_version[1]]:
        problems.append("Dockerfile: uv must be the Makefile's UV_VERSION")
    runtime = stages[-1]
    if any(
        word in run for run in instructions(runtime, "RUN") for word in ("apt-get", "pip ", "uv ")
    ):
        problems.append("Dockerfile: the runtime stage installs nothing")
    workdir = instructions(runtime, "WORKDIR")[-1]
    copies = [shlex.split(value) for value in instructions(runtime, "COPY")]
    targets = {
        (parts[-2], str(Path(workdir) / parts[-1]).rstrip("/"))
        for parts in copies
        if not parts[0].startswith("--from")
    }
    if ("migrations", f"{workdir}/migrations") not in targets:
        problems.append(
            f"Dockerfile: migrations/ must be copied to {workdir}/migrations, the working "
            "directory's migrations folder that migrations_location() searches"
        )
    if "**/.env" not in stack.dockerignore:
        problems.append(".dockerignore: must keep .env files (local secrets) out of the image")
    return problems


def check_compose_stack(stack: Stack, root: Path = ROOT) -> list[str]:  # noqa: C901 - a checklist of independent rules, read in one place
    """Compose mounts files that exist, starts in order, and wires Prometheus and Grafana."""
    problems = []
    services = stack.compose["services"]
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith(".") and not (root / source).exists():
                problems.append(f"docker-compose.yml {name}: {source} does not exist")
    conditions = {
        "migrate": {"postgres": "service_healthy"},
        "worker": {
            "migrate": "service_completed_successfully",
            "rabbitmq": "service_healthy",
            "postgres": "service_healthy",
        },
    }
    for name, wanted in conditions.items():
        given = {
            dep: spec.get("condition") for dep, spec in services[name].get("depends_on", {}).items()
        }
        if given != wanted:
            problems.append(f"docker-compose.yml {name}: depends_on {given}, want {wanted}")
        for dependency, condition in wanted.items():
            if condition == "service_healthy" and "healthcheck" not in services[dependency]:
                problems.append(f"docker-compose.yml {dependency}: needs a healthcheck")
    if services["worker"].get("deploy", {}).get("replicas", 1) < 2:
        problems.append("docker-compose.yml worker: run two replicas")
    mounts = {
        target: source
        for name in ("prometheus", "grafana")
        for source, target, *_ in (v.split(":") for v in services[name]["volumes"])
    }
    for rule_file in stack.prometheus.get("rule_files", []):
        target = str(Path("/etc/prometheus") / rule_file)
        if mounts.get(target) != "./deploy/prometheus/alerts.yml":
            problems.append(f"prometheus.yml: rule file {rule_file} is not the mounted alerts.yml")
    if not stack.prometheus.get("rule_files"):
        problems.append("prometheus.yml: loads no rule_files")
    problems.extend(
        f"prometheus.yml: scrapes {host}, not a compose service"
        for job in stack.prometheus["scrape_configs"]
        for sd in job.get("dns_sd_configs", [])
        for host in sd["names"]
        if host not in services
    )
    problems.extend(
        "grafana dashboards provider: its path is not the mounted dashboards"
        for provider in stack.grafana_dashboards["providers"]
        if mounts.get(provider["options"]["path"]) != "./deploy/grafana/dashboards"
    )
    problems.extend(
        f"grafana datasource: {source['url']} is not the compose Prometheus"
        for source in stack.grafana_datasources["datasources"]
        if source["url"] != "http://prometheus:9090" or "prometheus" not in services
    )
    return problems


def _database_user(env: dict[str, str]) -> str | None:
    url = env.get("FULFILMENT_DATABASE_URL")
    return urllib.parse.urlsplit(url).username if url else None


def _cronjob_pod(stack: Stack, name: str) -> dict[str, Any]:
    return stack.resource("CronJob", name)["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def _role_problems(
    where: str, owner: dict[str, str], runtime: dict[str, dict[str, str]]
) -> list[str]:
    """The owner's process grants to the runtime role its processes connect as, and is another."""
    problems = []
    owner_user = _database_user(owner)
    granted = owner.get("FULFILMENT_DATABASE_RUNTIME_ROLE", "")
    if not granted:
        problems.append(f"{where}: the migration sets no FULFILMENT_DATABASE_RUNTIME_ROLE")
    for name, env in runtime.items():
        user = _database_user(env)
        if user != granted:
            problems.append(
                f"{where} {name}: connects as {user}, the migration grants to {granted or 'nobody'}"
            )
        if user == owner_user:
            problems.append(f"{where} {name}: connects as the owner role {owner_user}")
    if owner_user in {None, "postgres"}:
        problems.append(f"{where}: the migration connects as {owner_user}, not an owner role")
    return problems


def check_database_roles(stack: Stack, root: Path = ROOT) -> list[str]:
    """The migration runs as the owner role, the worker and the relay as the runtime role.

    docs/security.md, "Least privilege": in compose and in Kubernetes, the owner's URL reaches
    only the migration (and the prune CronJob, which deletes), the runtime role's the worker and
    the relay, the migration grants to the role they connect as, and the local stack creates both.
    """
    problems = _role_problems(
        "docker-compose.yml",
        compose_environment(stack, "migrate"),
        {name: compose_environment(stack, name) for name in ("worker", "relay")},
    )
    init = [
        volume.split(":")[0]
        for volume in stack.compose["services"]["postgres"].get("volumes", [])
        if "/docker-entrypoint-initdb.d/" in volume
    ]
    created = {
        match.lower()
        for source in init
        if (root / source).is_file()
        for match in re.findall(r"CREATE ROLE (\w+)", (root / source).read_text(), re.IGNORECASE)
    }
    users = {
        _database_user(compose_environment(stack, name)) for name in ("migrate", "worker", "relay")
    }
    problems.extend(
        f"docker-compose.yml postgres: no init script creates role {user}"
        for user in sorted(user for user in users if user and user not in created)
    )
    job = k8s_environment(stack, migration_job(stack)["spec"]["template"]["spec"])
    problems.extend(
        _role_problems(
            "k8s",
            job,
            {
                "Deployment fulfilment-worker": k8s_environment(
                    stack, worker_deployment(stack)["spec"]["template"]["spec"]
                ),
                "Deployment fulfilment-relay": k8s_environment(
                    stack,
                    stack.resource("Deployment", "fulfilment-relay")["spec"]["template"]["spec"],
                ),
            },
        )
    )
    prune = k8s_environment(stack, _cronjob_pod(stack, "fulfilment-prune"))
    if _database_user(prune) != _database_user(job):
        problems.append(
            f"k8s CronJob fulfilment-prune: connects as {_database_user(prune)}; pruning"
            f" deletes, which only the owner role {_database_user(job)} may"
        )
    return problems


def check_prometheus_rule_rendered(stack: Stack) -> list[str]:
    """k8s/prometheusrule.yaml holds exactly the groups of deploy/prometheus/alerts.yml."""
    rule = stack.resource("PrometheusRule", "fulfilment")
    if rule["spec"] != stack.alerts:
        return [
            (
                "k8s/prometheusrule.yaml differs from deploy/prometheus/alerts.yml: run "
                "scripts/render-prometheus-rule"
            )
        ]
    return []


def check_kustomization(stack: Stack) -> list[str]:
    """kustomization.yaml lists every manifest but the Secret example, in its namespace."""
    listed = set(stack.kustomization["resources"])
    present = set(stack.k8s_files) - {"kustomization.yaml", "secret.example.yaml"}
    problems = []
    if listed != present:
        problems.append(
            f"k8s/kustomization.yaml: lists {sorted(listed)}, files are {sorted(present)}"
        )
    namespace = stack.kustomization["namespace"]
    for (kind, name), doc in stack.k8s.items():
        if kind != "Namespace" and doc["metadata"].get("namespace") != namespace:
            problems.append(f"k8s {kind} {name}: namespace is not {namespace}")
    return problems


def check_dispatcher(stack: Stack) -> list[str]:
    """The dispatcher's port agrees everywhere, it runs its command, and it has its URL.

    The container port, the probes' and the PodMonitor's port, the compose healthcheck and
    expose, and Prometheus' scrape are all ``FULFILMENT_DISPATCHER_PORT`` as the settings read
    it; the Deployment and the compose service run ``dispatcher``, which exits 2 without
    ``FULFILMENT_WAREHOUSE_URL``.
    """
    problems = []
    pod = stack.resource("Deployment", "fulfilment-dispatcher")["spec"]["template"]["spec"]
    settings = effective_settings(k8s_environment(stack, pod))
    container = pod["containers"][0]
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    if list(ports.values()) != [settings.http.dispatcher_port]:
        problems.append(
            f"k8s dispatcher: containerPort {list(ports.values())} is not"
            f" FULFILMENT_DISPATCHER_PORT {settings.http.dispatcher_port}"
        )
    for probe_name in ("livenessProbe", "readinessProbe"):
        port = container[probe_name]["httpGet"]["port"]
        if ports.get(port, port) != settings.http.dispatcher_port:
            problems.append(f"k8s dispatcher: {probe_name} port {port!r} is not the container's")
    monitor = stack.resource("PodMonitor", "fulfilment-dispatcher")["spec"]
    problems.extend(
        f"k8s dispatcher PodMonitor: port {endpoint['port']!r} is not the container's"
        for endpoint in monitor["podMetricsEndpoints"]
        if ports.get(endpoint["port"]) != settings.http.dispatcher_port
    )
    if container.get("args") != ["dispatcher"] or settings.warehouse.url is None:
        problems.append("k8s dispatcher: must run [dispatcher] with FULFILMENT_WAREHOUSE_URL set")
    service = stack.compose["services"]["dispatcher"]
    compose = effective_settings(compose_environment(stack, "dispatcher"))
    health = " ".join(service["healthcheck"]["test"])
    found = re.search(r"http://127\.0\.0\.1:(\d+)/health/ready", health)
    if found is None or int(found[1]) != compose.http.dispatcher_port:
        problems.append(
            f"docker-compose.yml dispatcher: healthcheck port is not {compose.http.dispatcher_port}"
        )
    if [str(p) for p in service.get("expose", [])] != [str(compose.http.dispatcher_port)]:
        problems.append(
            f"docker-compose.yml dispatcher: expose is not [{compose.http.dispatcher_port}]"
        )
    if service.get("command") != ["dispatcher"] or compose.warehouse.url is None:
        problems.append(
            "docker-compose.yml dispatcher: must run [dispatcher] with FULFILMENT_WAREHOUSE_URL set"
        )
    scraped = [
        sd["port"]
        for job in stack.prometheus["scrape_configs"]
        if job["job_name"] == "fulfilment-dispatcher"
        for sd in job["dns_sd_configs"]
    ]
    if scraped != [compose.http.dispatcher_port]:
        problems.append(
            f"prometheus.yml: scrapes the dispatcher on {scraped},"
            f" not [{compose.http.dispatcher_port}]"
        )
    return problems


def check_webhooks(stack: Stack) -> list[str]:  # noqa: C901, PLR0912 - a checklist of independent rules, read in one place
    """The intake runs its command on its two ports, with its secrets, behind an Ingress that
    exposes the endpoint alone, over TLS.

    In Kubernetes: the Deployment runs ``webhooks`` with several replicas as the runtime role,
    its ports are ``FULFILMENT_WEBHOOKS_PORT`` (the endpoint) and ``..._HTTP_PORT`` (probes on
    ``/health/live`` and ``/health/ready``, the PodMonitor's scrape), and
    ``FULFILMENT_WAREHOUSE_WEBHOOK_SECRETS`` is set; the Service forwards the endpoint's port
    and no other; the Ingress has one rule, the path ``/webhooks/warehouse`` exactly, to that
    Service's port, with TLS for its host; a PodDisruptionBudget keeps a replica through a
    drain. In compose: the service runs
    ``webhooks`` on the same two ports with a secret, and Prometheus scrapes the second.
    """
    problems = []
    deployment = stack.resource("Deployment", "fulfilment-webhooks")
    pod = deployment["spec"]["template"]["spec"]
    settings = effective_settings(k8s_environment(stack, pod))
    container = pod["containers"][0]
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    wanted = {"webhooks": settings.webhooks.port, "http": settings.webhooks.http_port}
    if ports != wanted:
        problems.append(f"k8s webhooks: container ports {ports}, want {wanted}")
    for probe_name, path in (
        ("livenessProbe", "/health/live"),
        ("readinessProbe", "/health/ready"),
    ):
        probe = container[probe_name]["httpGet"]
        if ports.get(probe["port"], probe["port"]) != settings.webhooks.http_port:
            problems.append(f"k8s webhooks: {probe_name} is not on FULFILMENT_WEBHOOKS_HTTP_PORT")
        if probe["path"] != path:
            problems.append(f"k8s webhooks: {probe_name} asks {probe['path']}, not {path}")
    commands = set(typer.main.get_command(cli.app).commands)  # type: ignore[attr-defined]
    if container.get("args") != ["webhooks"] or "webhooks" not in commands:
        problems.append("k8s webhooks: must run [webhooks], a `fulfilment` command")
    if not settings.warehouse.webhook_secrets.get_secret_value().split():
        problems.append("k8s webhooks: FULFILMENT_WAREHOUSE_WEBHOOK_SECRETS is not set")
    if _database_user(k8s_environment(stack, pod)) != settings.database.runtime_role:
        problems.append("k8s webhooks: must connect as the runtime role")
    if deployment["spec"].get("replicas", 1) < 2:
        problems.append("k8s webhooks: run several replicas (every one serves)")
    grace = pod.get("terminationGracePeriodSeconds", 30)
    pause = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    if pause >= grace:
        problems.append(f"k8s webhooks: the preStop pause ({pause} s) takes the whole grace period")
    selector = deployment["spec"]["selector"]["matchLabels"]
    service = stack.resource("Service", "fulfilment-webhooks")["spec"]
    if service["selector"] != selector:
        problems.append("k8s webhooks Service: does not select the Deployment's pods")
    forwarded = {
        port["name"]: ports.get(port["targetPort"], port["targetPort"]) for port in service["ports"]
    }
    if list(forwarded.values()) != [settings.webhooks.port]:
        problems.append(
            f"k8s webhooks Service: forwards {forwarded}, want the endpoint's port alone"
        )
    ingress = stack.resource("Ingress", "fulfilment-webhooks")["spec"]
    paths = [
        (rule.get("host"), path["path"], path["pathType"], path["backend"]["service"])
        for rule in ingress["rules"]
        for path in rule["http"]["paths"]
    ]
    if [(p, t) for _, p, t, _ in paths] != [(WEBHOOK_PATH, "Exact")]:
        problems.append(f"k8s webhooks Ingress: exposes {paths}, want {WEBHOOK_PATH} exactly")
    for host, _, _, backend in paths:
        if backend["name"] != "fulfilment-webhooks" or backend["port"].get("name") not in forwarded:
            problems.append(f"k8s webhooks Ingress: backend {backend} is not the Service's port")
        if not any(
            host in tls.get("hosts", []) and tls.get("secretName") for tls in ingress.get("tls", [])
        ):
            problems.append(f"k8s webhooks Ingress: no TLS certificate for {host}")
    budget = stack.resource("PodDisruptionBudget", "fulfilment-webhooks")["spec"]
    if budget["selector"]["matchLabels"] != selector or budget.get("maxUnavailable") != 1:
        problems.append("k8s webhooks PodDisruptionBudget: must let one replica go at a time")
    monitor = stack.resource("PodMonitor", "fulfilment-webhooks")["spec"]
    problems.extend(
        f"k8s webhooks PodMonitor: port {endpoint['port']!r} is not FULFILMENT_WEBHOOKS_HTTP_PORT"
        for endpoint in monitor["podMetricsEndpoints"]
        if ports.get(endpoint["port"]) != settings.webhooks.http_port
    )
    return problems + _compose_webhooks_problems(stack)


def _compose_webhooks_problems(stack: Stack) -> list[str]:
    """:func:`check_webhooks`' rules of the compose service and its scrape."""
    problems = []
    compose_service = stack.compose["services"]["webhooks"]
    compose = effective_settings(compose_environment(stack, "webhooks"))
    if compose_service.get("command") != ["webhooks"]:
        problems.append("docker-compose.yml webhooks: must run [webhooks]")
    if not compose.warehouse.webhook_secrets.get_secret_value().split():
        problems.append("docker-compose.yml webhooks: FULFILMENT_WAREHOUSE_WEBHOOK_SECRETS unset")
    exposed = [str(p) for p in compose_service.get("expose", [])]
    if exposed != [str(compose.webhooks.port), str(compose.webhooks.http_port)]:
        problems.append(f"docker-compose.yml webhooks: expose {exposed}, not the two ports")
    health = " ".join(compose_service["healthcheck"]["test"])
    found = re.search(r"http://127\.0\.0\.1:(\d+)/health/ready'", health)
    if found is None or int(found[1]) != compose.webhooks.http_port:
        port = compose.webhooks.http_port
        problems.append(f"docker-compose.yml webhooks: healthcheck is not /health/ready on {port}")
    # The simulator sends its webhooks to the intake, signed with a secret the intake holds.
    simulator = [str(word) for word in stack.compose["services"]["warehouse"]["command"]]
    url = simulator[simulator.index("--webhook-url") + 1] if "--webhook-url" in simulator else None
    wanted_url = f"http://webhooks:{compose.webhooks.port}{WEBHOOK_PATH}"
    if url != wanted_url:
        problems.append(f"docker-compose.yml warehouse: --webhook-url {url}, not {wanted_url}")
    signs_with = [
        simulator[index + 1] for index, word in enumerate(simulator) if word == "--webhook-secret"
    ] or [DEFAULT_WEBHOOK_SECRET]
    if not set(signs_with) <= set(compose.warehouse.webhook_secrets.get_secret_value().split()):
        problems.append("docker-compose.yml webhooks: does not hold the simulator's secret")
    scraped = [
        sd["port"]
        for job in stack.prometheus["scrape_configs"]
        if job["job_name"] == "fulfilment-webhooks"
        for sd in job["dns_sd_configs"]
    ]
    if scraped != [compose.webhooks.http_port]:
        problems.append(
            f"prometheus.yml: scrapes the intake on {scraped}, not [{compose.webhooks.http_port}]"
        )
    return problems


CHECKS: list[Callable[[Stack], list[str]]] = [
    check_environment_variables_exist,
    check_settings_validate,
    check_kubernetes_grace_period,
    check_compose_grace_period,
    check_ports,
    check_http_paths,
    check_probe_timeouts,
    check_rabbitmq_policies,
    check_rabbitmq_cluster,
    check_broker_users,
    check_compose_rabbitmq_cluster,
    check_broker_consumer_timeout,
    check_message_size,
    check_scaling,
    check_commands_and_image,
    check_image_build,
    check_compose_stack,
    check_database_roles,
    check_prometheus_rule_rendered,
    check_kustomization,
    check_dispatcher,
    check_webhooks,
]


def problems_of(check: Callable[[Stack], list[str]], stack: Stack) -> list[str]:
    """``check``'s problems; a file too broken to read (a missing key, a bad value) is one."""
    try:
        return check(stack)
    except (KeyError, IndexError, TypeError, ValueError, ValidationError) as error:
        return [f"{check.__name__}: cannot read the files: {type(error).__name__}: {error}"]


def all_problems(stack: Stack) -> list[str]:
    """Every rule's problems on ``stack``."""
    return [problem for check in CHECKS for problem in problems_of(check, stack)]
