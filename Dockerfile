# The worker image. Two stages: `build` installs the locked dependencies and the project into a
# virtual environment with uv; `runtime` copies only that environment, the alembic files and
# nothing else (no uv, no pip cache, no compilers) and runs as an unprivileged user. A third,
# `warehouse-simulator`, is the compose stack's warehouse system.
#
# Both stages use the same base image, pinned by tag and digest, because the virtual
# environment links to the base image's interpreter at /usr/local/bin/python3.11.

FROM python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d AS build

# UV_PROJECT_ENVIRONMENT: the environment is built where the runtime stage runs it, so the
# console scripts' shebangs stay valid. UV_PYTHON_DOWNLOADS=never: use the base image's Python.
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_NO_CACHE=1 \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/app/.venv

# The same uv release as the Makefile's UV_VERSION.
RUN pip install --no-cache-dir uv==0.13.8

WORKDIR /src

# Dependencies first, from the lock file alone (--frozen: never re-resolve), so this layer is
# rebuilt only when uv.lock changes; --no-dev leaves out the test and lint tools.
COPY pyproject.toml uv.lock ./
RUN uv sync --frozen --no-dev --no-install-project

# Then the project itself, as a regular (non-editable) install: the runtime stage has no /src.
COPY README.md ./
COPY src ./src
RUN uv sync --frozen --no-dev --no-editable


# The warehouse simulator of the compose stack and the demo (`docker build --target
# warehouse-simulator`): the same environment (uvicorn) and the simulator's package, which the
# service's image does not carry. Before `runtime`, so that a build without --target is still
# the service.
FROM python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d AS warehouse-simulator

WORKDIR /app
COPY --from=build /app/.venv /app/.venv
COPY simulator ./simulator
ENV PATH=/app/.venv/bin:$PATH \
    PYTHONPATH=/app/simulator \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 8090
ENTRYPOINT ["python", "-m", "warehouse_simulator", "--host", "0.0.0.0", "--port", "8090"]


FROM python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d AS runtime

RUN groupadd --system --gid 10001 fulfilment \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin fulfilment

# `fulfilment migrate` finds the alembic migrations (the revisions and migrations/sql, the SQL
# files they load) in ./migrations of the working directory
# (fulfilment.adapters.postgres.schema.migrations_location), so they sit in /app beside it.
WORKDIR /app
COPY --from=build /app/.venv /app/.venv
COPY alembic.ini ./
COPY migrations ./migrations

# PYTHONDONTWRITEBYTECODE: the root filesystem is read-only in Kubernetes; the dependencies
# were compiled at build time. The files above belong to root, so the service cannot change them.
ENV PATH=/app/.venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    FULFILMENT_LOG_FORMAT=json

USER 10001:10001

# FULFILMENT_HTTP_PORT: /health/live, /health/ready and /metrics.
EXPOSE 8080

# The worker is PID 1 (exec form, no shell in between): it installs its own SIGTERM and SIGINT
# handlers, which start the drain, and starts no child processes, so no init is needed to
# forward signals or reap zombies.
STOPSIGNAL SIGTERM

# Liveness only: readiness (broker, consumer, database) is the orchestrator's business.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('FULFILMENT_HTTP_PORT', '8080') + '/health/live', timeout=3)"]

ENTRYPOINT ["fulfilment"]
CMD ["worker"]
