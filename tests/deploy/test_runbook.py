"""``docs/runbook.md`` stays true: every command and name it gives an operator exists.

Each rule reads the runbook's code (inline spans and fenced blocks) and checks it against the
code and the manifests, never against a copy of them:

- every ``fulfilment ...`` command (also inside ``kubectl exec``) parses with the command line's
  own parser: its sub-commands, options and their values;
- every ``kubectl ...`` command names the manifests' namespace and resources that exist; a label
  selector selects exactly the worker's pods; a container or port is the worker's; nothing
  scales a Deployment that KEDA scales; annotations are KEDA's documented pause annotations; a
  patch of the ScaledObject is one its CRD accepts and keeps the scaling rules of ``stack.py``;
- every metric (with its label matchers) is exported by the worker, the relay, the
  dispatcher or the intake, every alert is a rule of ``deploy/prometheus/alerts.yml``, every
  dashboard panel the runbook names is one of the dashboard's, every ``FULFILMENT_*`` variable
  is a setting, every link points at a section;
- every other name (log events, queues, headers, labels, columns) is a string of the source,
  every file exists, every failure class is one, and every ``SELECT`` plans on a migrated
  database.

Each rule passes on the committed runbook; each break below (one name changed, or a command
added) makes its rule fail.
"""

from __future__ import annotations

import ast
import copy
import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
import typer.main
import yaml
from cloudcoil.models.keda.v1alpha1 import ScaledObject
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from sqlalchemy.engine import make_url
from typer.core import TyperGroup

from fulfilment.contracts import dead_letter
from fulfilment.contracts.dead_letter import FailureClass
from fulfilment.contracts.result_events import RESULT_ROUTING_KEYS
from fulfilment.entrypoints import cli
from fulfilment.entrypoints.worker import build_worker
from fulfilment.intake.signatures import Refusal
from fulfilment.observability.dispatcher_metrics import DispatcherMetrics
from fulfilment.observability.intake_metrics import IntakeMetrics
from fulfilment.observability.relay_metrics import RelayMetrics
from fulfilment.observability.tracing import Tracing
from fulfilment.settings import Settings
from tests.deploy.stack import ROOT, Stack, check_scaling, http_get, is_setting, load_stack
from tests.support.fakes import FakeStock

RUNBOOK = ROOT / "docs/runbook.md"
SOURCE = ROOT / "src/fulfilment"

KEDA_ANNOTATIONS = {
    "autoscaling.keda.sh/paused": re.compile(r"true|false"),
    "autoscaling.keda.sh/paused-replicas": re.compile(r"\d+|[A-Z]+"),
}
"""KEDA's annotations that pause a ScaledObject, and their values (keda.sh, "ScaledObject
specification": ``paused`` holds the current count, ``paused-replicas`` scales to the count
first); removed (``KEY-``), autoscaling resumes. ``N`` and the like stand for a number."""

POSTGRES_SETTINGS = {"max_connections"}
"""PostgreSQL's own settings the runbook names; the database test finds each in pg_settings."""

RABBITMQ_POLICY_WORDS = {
    "max_message_size",
    "x-max-length",
    "user_id",
    "message-ttl",
    "max-length",
    "max-length-bytes",
    "drop-head",
    "reject-publish",
    "reject-publish-dlx",
}
"""RabbitMQ's own words the runbook names: policy keys and overflow values (RabbitMQ docs,
"Queue Length Limit" and "Time-To-Live and Expiration"), the queue argument ``x-max-length``,
the setting ``max_message_size`` (rabbitmq.conf) and the AMQP property ``user_id``: the
broker's vocabulary, not the service's."""

KINDS = {
    "deploy": "Deployment",
    "deployment": "Deployment",
    "job": "Job",
    "pod": "Pod",
    "pods": "Pod",
    "scaledobject": "ScaledObject",
    "so": "ScaledObject",
    "hpa": "HorizontalPodAutoscaler",
    "configmap": "ConfigMap",
    "cm": "ConfigMap",
    "secret": "Secret",
    "pdb": "PodDisruptionBudget",
}
"""kubectl's names of the kinds the runbook may name (singular, plural and short forms)."""

KUBECTL_OPTIONS_WITH_VALUE = {
    "-n",
    "--namespace",
    "-l",
    "--selector",
    "-c",
    "--container",
    "-o",
    "--output",
    "-p",
    "--patch",
    "--type",
    "--replicas",
    "--timeout",
    "--since",
    "--tail",
    "-k",
    "-f",
}

METRIC = re.compile(r"\b((?:fulfilment|faststream|process|python)_[a-z0-9_]+)(\{[^}]*\})?")
SETTING = re.compile(r"\bFULFILMENT_[A-Z0-9_]+\b")
NAME = re.compile(r"[a-z][a-z0-9]*(?:[._-][a-z0-9]+)+(?:-\*)?")
"""A name in code: lower-case words joined by dots, underscores or hyphens (``consumer.paused``,
``fulfilment.order-placed.dlq``, ``lock_timeout``, ``x-delivery-limit``, ``x-fulfilment-*``)."""
FILE = re.compile(r"[\w./-]+/[\w.-]+\.(?:md|ya?ml|json|py|sql|toml|csv)")
GROUP = re.compile(r"([a-z_]+)/(-|\.\.\.|[A-Z]\w*)")
"""A dead-letter group as ``fulfilment dlq list`` shows it: ``<failure class>/<exception>``."""
ALERT = re.compile(r"\bFulfilment[A-Z]\w+")
FENCE = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)
"""A fenced block, also one indented into a list item."""


# --- reading the runbook ------------------------------------------------------------------


@dataclass(frozen=True)
class Runbook:
    """The runbook's text and what it holds as code."""

    text: str

    @property
    def fences(self) -> list[str]:
        return FENCE.findall(self.text)

    @property
    def prose(self) -> str:
        return FENCE.sub("", self.text)

    @property
    def spans(self) -> list[str]:
        """Inline code, with the line breaks of the page's wrapping undone."""
        return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", self.prose)]

    @property
    def fenced_lines(self) -> list[str]:
        """Lines of the fenced blocks, a ``\\`` continuation joined, a ``$`` prompt dropped."""
        return [
            line.strip().removeprefix("$ ")
            for block in self.fences
            for line in re.sub(r"\\\n\s*", " ", block).splitlines()
        ]

    @property
    def code(self) -> list[str]:
        return self.spans + self.fenced_lines

    def commands(self, program: str) -> list[list[str]]:
        """Every command line of ``program`` in the code, as its words (comments dropped)."""
        return [
            shlex.split(code, comments=True)
            for code in self.code
            if code == program or code.startswith(f"{program} ")
        ]

    @property
    def headings(self) -> list[str]:
        return [line.lstrip("#").strip() for line in self.text.splitlines() if line.startswith("#")]

    @property
    def paragraphs(self) -> list[str]:
        return [" ".join(block.split()) for block in re.split(r"\n\s*\n", self.prose)]


def anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


# --- what the code knows ------------------------------------------------------------------


def _worker_registry() -> Any:
    async def no_database() -> None:
        return None

    worker = build_worker(Settings(), stock=FakeStock(), database_ping=no_database)
    return worker.metrics.registry


def exported_samples() -> dict[str, list[dict[str, str]]]:
    """Every sample name the worker, the relay, the dispatcher or the intake exports, with the
    label sets of its series."""
    samples: dict[str, list[dict[str, str]]] = {}
    relay = RelayMetrics(RESULT_ROUTING_KEYS).registry
    dispatcher = DispatcherMetrics().registry
    intake = IntakeMetrics(version="0", refusals=tuple(str(r) for r in Refusal)).registry
    # Each process's registry gets the dropped spans' counter once tracing is on.
    traced = CollectorRegistry()
    Tracing(
        traced, service_name="fulfilment-worker", version="0", exporter=InMemorySpanExporter()
    ).provider.shutdown()
    families = [
        *_worker_registry().collect(),
        *relay.collect(),
        *dispatcher.collect(),
        *intake.collect(),
    ]
    for family in [*families, *traced.collect()]:
        names = {
            "counter": [f"{family.name}_total"],
            "histogram": [f"{family.name}{end}" for end in ("_bucket", "_count", "_sum")],
        }.get(family.type, [family.name])
        for name in names:
            samples.setdefault(name, [])
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(dict(sample.labels))
    return samples


@dataclass(frozen=True)
class SourceStrings:
    """The string literals of ``src/fulfilment`` (f-strings' literal pieces included)."""

    literals: frozenset[str]
    tails: frozenset[str]
    """The literal ends of f-strings such as ``f"{name}.dead_lettered"``."""

    def knows(self, name: str) -> bool:
        if name in self.literals or name.removesuffix("*") in self.literals:
            return True
        head, dot, tail = name.partition(".")
        return bool(dot) and head in self.literals and f".{tail}" in self.tails


def source_strings() -> SourceStrings:
    literals: set[str] = set()
    tails: set[str] = set()
    for path in SOURCE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                literals.add(node.value)
            if isinstance(node, ast.JoinedStr) and isinstance(node.values[-1], ast.Constant):
                tails.add(str(node.values[-1].value))
    headers = {
        value
        for value in vars(dead_letter).values()
        if isinstance(value, str) and value.startswith("x-")
    }
    # The alert rules' own words (`runbook_url`, label names and values).
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    literals |= set(_words(rules))
    # A header the runbook lists by its suffix (`failure-class`) is the service's header.
    literals |= headers | {
        header.removeprefix(dead_letter.HEADER_PREFIX)
        for header in headers
        if header.startswith(dead_letter.HEADER_PREFIX)
    }
    return SourceStrings(frozenset(literals), frozenset(tails))


def _words(document: Any) -> list[str]:
    """Every key and string value of a parsed YAML document."""
    if isinstance(document, dict):
        return [word for key, value in document.items() for word in [key, *_words(value)]]
    if isinstance(document, list):
        return [word for item in document for word in _words(item)]
    return [document] if isinstance(document, str) else []


def dashboard_titles() -> set[str]:
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/fulfilment.json").read_text())
    return {dashboard["title"], *(panel["title"] for panel in dashboard["panels"])}


def alert_names() -> set[str]:
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    return {rule["alert"] for group in rules["groups"] for rule in group["rules"]}


# --- commands -----------------------------------------------------------------------------


def fulfilment_problem(words: list[str]) -> str | None:
    """Why ``words`` (``fulfilment ...``) would not parse, or None; nothing is run."""
    command = typer.main.get_command(cli.app)
    commands = [command]
    while commands:
        each = commands.pop()
        if isinstance(each, TyperGroup):
            commands.extend(each.commands.values())
        else:
            each.callback = lambda **_: None
    arguments = [word for word in words[1:] if word != "..."]
    if not arguments:
        return None  # `fulfilment ...`: any command
    try:
        command.main(arguments, prog_name="fulfilment", standalone_mode=False)
    except Exception as error:  # noqa: BLE001 - every parse failure is the problem to report
        return f"`{shlex.join(words)}`: {type(error).__name__}: {error}"
    return None


@dataclass
class Kubectl:
    """A kubectl command line, read: its verb, resources, options and an exec'd command."""

    words: list[str]
    positional: list[str]
    options: dict[str, str]
    inner: list[str]

    @classmethod
    def parse(cls, words: list[str]) -> Kubectl:
        inner: list[str] = []
        if "--" in words:
            at = words.index("--")
            words, inner = words[:at], words[at + 1 :]
        positional: list[str] = []
        options: dict[str, str] = {}
        rest = iter(words[1:])
        for word in rest:
            if word.startswith("-"):
                key, equals, value = word.partition("=")
                if not equals:
                    value = next(rest, "") if key in KUBECTL_OPTIONS_WITH_VALUE else "true"
                options[
                    {"--namespace": "-n", "--selector": "-l", "--container": "-c"}.get(key, key)
                ] = value
            else:
                positional.append(word)
        return cls(words, positional, options, inner)

    @property
    def verb(self) -> str:
        return (
            " ".join(self.positional[:2])
            if self.positional[:1] == ["rollout"]
            else self.positional[0]
        )

    @property
    def resources(self) -> list[tuple[str, str | None]]:
        """``(kind, name)`` of each resource named; name None for a kind alone (``get pods``)."""
        args = self.positional[len(self.verb.split()) :]
        found: list[tuple[str, str | None]] = []
        if args and "/" not in args[0] and args[0] in KINDS:
            names = [
                arg
                for arg in args[1:]
                if "=" not in arg and not arg.endswith("-") and ":" not in arg and not arg.isdigit()
            ]
            found.append((KINDS[args[0]], names[0] if names else None))
        for arg in args:
            kind, slash, name = arg.partition("/")
            if slash and kind in KINDS:
                found.append((KINDS[kind], name))
        return found

    def __str__(self) -> str:
        return shlex.join(self.words + (["--", *self.inner] if self.inner else []))


def kubectl_problems(command: Kubectl, stack: Stack) -> list[str]:
    """Why ``command`` would not do what the runbook means on the deployed manifests."""
    if command.verb == "apply":
        # The kustomization sets the namespace of everything it applies.
        return [] if command.options.get("-k") == "k8s" else [f"`{command}`: apply -k k8s"]
    problems = [
        *_namespace_problems(command, stack),
        *_resource_problems(command, stack),
        *_pod_problems(command, stack),
    ]
    if command.verb == "annotate":
        problems.extend(_annotation_problems(command))
    if command.verb == "patch":
        problems.extend(_patch_problems(command, stack))
    if command.inner[:1] == ["fulfilment"] and (problem := fulfilment_problem(command.inner)):
        problems.append(f"`{command}`: {problem}")
    return problems


def _namespace_problems(command: Kubectl, stack: Stack) -> list[str]:
    namespaces = {doc["metadata"].get("namespace") for doc in stack.k8s.values()} - {None}
    if command.options.get("-n") in namespaces:
        return []
    return [f"`{command}`: not in the namespace of the manifests {sorted(namespaces)}"]


def _resource_problems(command: Kubectl, stack: Stack) -> list[str]:
    where = f"`{command}`"
    if not command.resources and "-l" not in command.options:
        return [f"{where}: names no resource"]
    scaled = [doc for (kind, _), doc in stack.k8s.items() if kind == "ScaledObject"]
    scaled_targets = {doc["spec"]["scaleTargetRef"]["name"] for doc in scaled}
    autoscalers = {
        doc["spec"]
        .get("advanced", {})
        .get("horizontalPodAutoscalerConfig", {})
        .get("name", f"keda-hpa-{doc['metadata']['name']}")
        for doc in scaled
    }
    problems = []
    for kind, name in command.resources:
        if kind == "HorizontalPodAutoscaler":
            if name not in autoscalers:
                problems.append(f"{where}: no autoscaler {name!r} (KEDA's is keda-hpa-<name>)")
        elif kind == "Pod":
            if name is not None or "-l" not in command.options:
                problems.append(f"{where}: select the worker's pods with -l (or deploy/)")
        elif (kind, name) not in stack.k8s:
            problems.append(f"{where}: no {kind} {name!r} in k8s/")
        if command.verb == "scale" and kind == "Deployment" and name in scaled_targets:
            problems.append(f"{where}: KEDA owns the replica count of {name} (scaledobject.yaml)")
    return problems


def _pod_problems(command: Kubectl, stack: Stack) -> list[str]:
    """The label selector, container and port of a command on the worker's pods."""
    where = f"`{command}`"
    problems = []
    workloads = [
        stack.k8s[(kind, str(name))]
        for kind, name in command.resources
        if kind in {"Deployment", "Job"} and (kind, name) in stack.k8s
    ]
    if "-l" in command.options:
        deployment = stack.resource("Deployment", "fulfilment-worker")
        selector = dict(pair.split("=", 1) for pair in command.options["-l"].split(","))
        chosen = deployment["spec"]["selector"]["matchLabels"].items()
        labels = deployment["spec"]["template"]["metadata"]["labels"].items()
        if not chosen <= selector.items() <= labels:
            problems.append(f"{where}: -l does not select exactly the worker's pods")
        workloads.append(deployment)
    for workload in workloads:
        containers = workload["spec"]["template"]["spec"]["containers"]
        if command.options.get("-c", containers[0]["name"]) not in {c["name"] for c in containers}:
            problems.append(f"{where}: no such container in {workload['metadata']['name']}")
        ports = {port["containerPort"] for c in containers for port in c.get("ports", [])}
        forwarded = command.positional[2:] if command.verb == "port-forward" else []
        problems.extend(
            f"{where}: the pod listens on {sorted(ports)}, not {mapping}"
            for mapping in forwarded
            if int(mapping.rpartition(":")[2]) not in ports
        )
    return problems


def _annotation_problems(command: Kubectl) -> list[str]:
    problems = []
    for change in command.positional[3:]:
        key, equals, value = change.partition("=")
        pattern = KEDA_ANNOTATIONS.get(key if equals else key.removesuffix("-"))
        if pattern is None or (equals and not pattern.fullmatch(value)):
            problems.append(f"`{command}`: {change!r} is not one of KEDA's pause annotations")
    return problems


def _patch_problems(command: Kubectl, stack: Stack) -> list[str]:
    where = f"`{command}`"
    [(kind, name)] = command.resources
    if kind != "ScaledObject" or command.options.get("--type") != "merge":
        return [f"{where}: only merge patches of the ScaledObject are checked"]
    patched = stack.copy()
    doc = patched.resource(kind, str(name))
    _merge(doc, json.loads(command.options["-p"]))
    read_back = ScaledObject.model_validate(doc).model_dump(
        mode="json", by_alias=True, exclude_unset=True
    )
    problems = [] if read_back == doc else [f"{where}: a field the ScaledObject CRD does not have"]
    return problems + [f"{where}: {problem}" for problem in check_scaling(patched)]


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """A JSON merge patch (RFC 7386), in place."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


# --- the rules ----------------------------------------------------------------------------


def check_fulfilment_commands(runbook: Runbook, _stack: Stack) -> list[str]:
    """Every ``fulfilment`` command parses: sub-commands, options, values."""
    commands = runbook.commands("fulfilment")
    assert commands, "the runbook shows no fulfilment command"
    return [problem for words in commands if (problem := fulfilment_problem(words))]


def check_kubectl_commands(runbook: Runbook, stack: Stack) -> list[str]:
    """Every ``kubectl`` command names what the manifests deploy, and scales nothing KEDA does."""
    commands = runbook.commands("kubectl")
    assert commands, "the runbook shows no kubectl command"
    return [p for words in commands for p in kubectl_problems(Kubectl.parse(words), stack)]


def check_http_requests(runbook: Runbook, _stack: Stack) -> list[str]:
    """Every ``curl`` asks the worker's port for a path the worker serves."""
    problems = []
    port = Settings().http.http_port
    for words in runbook.commands("curl"):
        url = next(word for word in words[1:] if not word.startswith("-"))
        match = re.fullmatch(r"(?:http://)?[\w.-]+:(\d+)(/\S*)", url)
        if match is None or int(match[1]) != port or http_get(match[2], healthy=True)[0] == 404:
            problems.append(f"`{shlex.join(words)}`: the worker serves no {url}")
    return problems


def check_metrics(runbook: Runbook, _stack: Stack) -> list[str]:
    """Every metric the runbook names is exported, and has a series with its label values."""
    samples = exported_samples()
    problems = []
    for code in runbook.code:
        for name, matchers in METRIC.findall(code):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', matchers))
            if name not in samples:
                problems.append(f"{name}: the worker exports no such metric")
            elif labels and not any(labels.items() <= series.items() for series in samples[name]):
                problems.append(f"{name}{matchers}: no such series")
    return problems


def check_alerts_and_links(runbook: Runbook, _stack: Stack) -> list[str]:
    """Alerts named are rules; links point at sections."""
    known = alert_names()
    named = set(ALERT.findall("\n".join(runbook.headings))) | set(
        ALERT.findall(" ".join(re.findall(r"\[([^\]]+)\]\(#", runbook.text)))
    )
    anchors = {anchor(heading) for heading in runbook.headings}
    return [f"{alert}: no such alert rule" for alert in sorted(named - known)] + [
        f"#{target}: no such section"
        for target in re.findall(r"\]\(#([^)]+)\)", runbook.text)
        if target not in anchors
    ]


def check_dashboard_panels(runbook: Runbook, _stack: Stack) -> list[str]:
    """What a paragraph about the dashboard names in bold is a panel (or the dashboard)."""
    titles = dashboard_titles()
    return [
        f"**{bold}**: no such panel"
        for paragraph in runbook.paragraphs
        if re.search(r"dashboard|panel", paragraph, re.IGNORECASE)
        for bold in re.findall(r"\*\*([^*]+)\*\*", paragraph)
        if bold not in titles
    ]


def check_settings(runbook: Runbook, _stack: Stack) -> list[str]:
    """Every ``FULFILMENT_*`` variable is a setting."""
    return [
        f"{name}: not a setting"
        for code in runbook.code
        for name in SETTING.findall(code)
        if not is_setting(name)
    ]


def check_names(runbook: Runbook, stack: Stack) -> list[str]:
    """Log events, queues, headers, labels and columns are strings of the source, resources
    are the manifests'; files exist; dead-letter groups and the failure-class table name
    failure classes."""
    strings = source_strings()
    resources = {name for _, name in stack.k8s}
    classes = {str(failure_class) for failure_class in FailureClass}
    problems = []
    for span in runbook.spans:
        if FILE.fullmatch(span):
            if not (ROOT / span).exists():
                problems.append(f"{span}: no such file")
        elif group := GROUP.fullmatch(span):
            if group[1] not in classes:
                problems.append(f"{span}: {group[1]!r} is not a failure class")
        elif (
            NAME.fullmatch(span)
            and not METRIC.fullmatch(span)
            and not strings.knows(span)
            and span not in resources | POSTGRES_SETTINGS | RABBITMQ_POLICY_WORDS
        ):
            problems.append(f"{span}: the source has no such name")
    table = runbook.text.partition("### Failure classes")[2].partition("\n## ")[0]
    problems.extend(
        f"{row}: not a failure class"
        for row in re.findall(r"^\| `([^`]+)` \|", table, re.MULTILINE)
        if row not in classes
    )
    return problems


CHECKS: list[Callable[[Runbook, Stack], list[str]]] = [
    check_fulfilment_commands,
    check_kubectl_commands,
    check_http_requests,
    check_metrics,
    check_alerts_and_links,
    check_dashboard_panels,
    check_settings,
    check_names,
]


@pytest.fixture(scope="module")
def stack() -> Stack:
    return load_stack()


@pytest.fixture(scope="module")
def runbook() -> Runbook:
    return Runbook(RUNBOOK.read_text())


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_the_runbook_passes(
    runbook: Runbook, stack: Stack, check: Callable[..., list[str]]
) -> None:
    assert check(runbook, stack) == []


def _replace(old: str, new: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        assert old in text, f"the runbook no longer says {old!r}"
        return text.replace(old, new, 1)

    return edit


def _append(line: str) -> Callable[[str], str]:
    return lambda text: f"{text}\n{line}\n"


BREAKS: dict[str, tuple[Callable[[str], str], Callable[..., list[str]]]] = {
    "a Deployment that does not exist": (
        _replace("deploy/fulfilment-worker", "deploy/fulfilment"),
        check_kubectl_commands,
    ),
    "another namespace": (_replace("-n fulfilment ", "-n default "), check_kubectl_commands),
    "scaling what KEDA scales": (
        _append("`kubectl -n fulfilment scale deploy/fulfilment-worker --replicas=4`"),
        check_kubectl_commands,
    ),
    "a selector that also takes the migration's pods": (
        _append("`kubectl -n fulfilment get pods -l app.kubernetes.io/name=fulfilment`"),
        check_kubectl_commands,
    ),
    "an annotation KEDA does not know": (
        _replace("autoscaling.keda.sh/paused-replicas=", "autoscaling.keda.sh/pause-replicas="),
        check_kubectl_commands,
    ),
    "a ScaledObject field that does not exist": (
        _replace('"maxReplicaCount"', '"maxReplicas"'),
        check_kubectl_commands,
    ),
    "more replicas than the database has connections": (
        _replace('"maxReplicaCount":12', '"maxReplicaCount":40'),
        check_kubectl_commands,
    ),
    "a container that does not exist": (
        _append("`kubectl -n fulfilment logs deploy/fulfilment-worker -c fulfilment`"),
        check_kubectl_commands,
    ),
    "a command line option that does not exist": (
        _replace(
            "--group unexpected/IntegrityError --yes", "--grup unexpected/IntegrityError --yes"
        ),
        check_fulfilment_commands,
    ),
    "a command that does not exist": (
        _replace("fulfilment dlq list", "fulfilment dlq ls"),
        check_fulfilment_commands,
    ),
    "a command inside kubectl exec": (
        _append("`kubectl -n fulfilment exec deploy/fulfilment-worker -- fulfilment reports`"),
        check_kubectl_commands,
    ),
    "a path the worker does not serve": (
        _replace("/health/ready", "/ready"),
        check_http_requests,
    ),
    "a metric that does not exist": (
        _replace("fulfilment_messages_in_flight", "fulfilment_messages_inflight"),
        check_metrics,
    ),
    "a label value with no series": (
        _replace('{outcome="duplicate"}', '{outcome="duplicated"}'),
        check_metrics,
    ),
    "an alert that does not exist": (
        _replace("## FulfilmentNoConsumers", "## FulfilmentNoConsumer"),
        check_alerts_and_links,
    ),
    "a link to no section": (
        _replace("(#fulfilmentbackloggrowing)", "(#fulfilmentbacklog)"),
        check_alerts_and_links,
    ),
    "a panel that does not exist": (
        _replace("**Database retries**", "**Retries**"),
        check_dashboard_panels,
    ),
    "a setting that does not exist": (
        _replace("FULFILMENT_DATABASE_POOL_SIZE", "FULFILMENT_POOL_SIZE"),
        check_settings,
    ),
    "a log event the worker does not write": (
        _replace("`consumer.paused`", "`consumer.pause`"),
        check_names,
    ),
    "a queue that does not exist": (
        _replace("`fulfilment.order-placed.dlq`", "`fulfilment.dlq`"),
        check_names,
    ),
    "a header that does not exist": (
        _replace("`first-failure-at`", "`first-failed-at`"),
        check_names,
    ),
    "a file that does not exist": (
        _replace("`deploy/prometheus/alerts.yml`", "`deploy/alerts.yml`"),
        check_names,
    ),
    "a failure class that does not exist": (
        _replace("| `broker_other` |", "| `broker_misc` |"),
        check_names,
    ),
}


@pytest.mark.parametrize("name", BREAKS)
def test_a_break_fails_its_rule(name: str, runbook: Runbook, stack: Stack) -> None:
    edit, check = BREAKS[name]
    assert check(Runbook(edit(runbook.text)), stack) != []


@pytest.mark.postgres
async def test_every_query_and_database_setting_of_the_runbook_exists(
    runbook: Runbook, database_url: str
) -> None:
    queries = [
        span.replace("'...'", "NULL") for span in runbook.spans if span.startswith("SELECT ")
    ]
    assert queries
    url = make_url(database_url).set(drivername="postgresql")
    connection = await asyncpg.connect(url.render_as_string(hide_password=False))
    try:
        for query in queries:
            await connection.execute(f"EXPLAIN {query}")
        known = await connection.fetchval(
            "SELECT count(*) FROM pg_settings WHERE name = any($1::text[])",
            sorted(POSTGRES_SETTINGS),
        )
        assert known == len(POSTGRES_SETTINGS)
    finally:
        await connection.close()
