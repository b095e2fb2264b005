"""Typed settings by concern, read once from ``FULFILMENT_*`` environment variables and ``.env``.

Each concern is a group of its own (:class:`DatabaseSettings`, :class:`BrokerSettings`, ...,
gathered by :class:`Settings`); a variable keeps its plain name (``FULFILMENT_<NAME>``) whatever
its group, and each root takes the groups it reads. Every number that bounds time is a named
setting in seconds, and the settings refuse to exist when they do not nest
(docs/configuration.md)::

    lock timeout < statement timeout < retry budget < handler deadline < graceful timeout
        < orchestrator grace period
    handler deadline < broker consumer timeout

so that a transient error is retried by one layer within the handler's deadline, an in-flight
handler finishes before the broker drains it away, and Kubernetes never SIGKILLs a draining pod.
With group commit a delivery may also wait for the transaction running before its batch; in a
long database slowdown its deadline can then pass while its batch commits, and the delivery is
requeued and answered ``duplicate:event`` on redelivery (docs/events.md, "Outcomes and failures").

The groups and their fields are in :mod:`fulfilment.settings.groups`, the URLs' checks in
:mod:`fulfilment.settings.urls`, what is said of a misspelt variable or a misread ``.env`` line
in :mod:`fulfilment.settings.dotenv`; this module gathers the groups and reads them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fulfilment.settings.dotenv import (
    ENV_FILE,
    ENV_PREFIX,
    EnvFileReading,
    read_env_file,
    unknown_variables,
)
from fulfilment.settings.groups import (
    AMQP_TLS_PARAMETERS,
    ENV_FILE_ENCODING,
    SSL_MODES,
    BrokerSettings,
    DatabaseSettings,
    DeadlineSettings,
    HttpSettings,
    ProcessSettings,
    RelaySettings,
    RetentionSettings,
    SettingsGroup,
    WarehouseSettings,
    WebhooksSettings,
    WorkerSettings,
    env_name,
    not_less,
)

__all__ = [
    "AMQP_TLS_PARAMETERS",
    "ENV_PREFIX",
    "SSL_MODES",
    "BrokerSettings",
    "DatabaseSettings",
    "DeadlineSettings",
    "HttpSettings",
    "ProcessSettings",
    "RelaySettings",
    "RetentionSettings",
    "Settings",
    "SettingsError",
    "SettingsGroup",
    "WarehouseSettings",
    "WebhooksSettings",
    "WorkerSettings",
    "env_name",
    "from_variables",
    "load_settings",
    "variables",
]


class SettingsError(Exception):
    """The environment holds a value the service cannot start with.

    ``str(error)`` is one line per problem, each naming the environment variable.
    """


class Settings(BaseModel):
    """All of the service's configuration, one group per concern; built by the roots and the CLI.

    Each group reads its own variables when it is not given (``Settings()`` reads them all);
    :func:`load_settings` also says every problem at once. A group's ``title`` heads its
    section of the configuration reference (``make docs``). The one rule across groups, the
    statement timeout within the retry budget, is checked here.
    """

    # A keyword that is no group (a flat ``database_url=`` of the settings before they were
    # grouped) would otherwise be dropped in silence, and the defaults used instead.
    model_config = ConfigDict(frozen=True, extra="forbid")

    database: DatabaseSettings = Field(default_factory=DatabaseSettings, title="Database")
    broker: BrokerSettings = Field(default_factory=BrokerSettings, title="Broker")
    deadlines: DeadlineSettings = Field(default_factory=DeadlineSettings, title="Deadlines")
    worker: WorkerSettings = Field(default_factory=WorkerSettings, title="Worker")
    relay: RelaySettings = Field(default_factory=RelaySettings, title="Relay")
    warehouse: WarehouseSettings = Field(
        default_factory=WarehouseSettings, title="Warehouse system and dispatcher"
    )
    webhooks: WebhooksSettings = Field(
        default_factory=WebhooksSettings, title="Warehouse webhooks intake"
    )
    http: HttpSettings = Field(default_factory=HttpSettings, title="Health and metrics endpoints")
    process: ProcessSettings = Field(default_factory=ProcessSettings, title="Logs and event loop")
    retention: RetentionSettings = Field(default_factory=RetentionSettings, title="Retention")

    @model_validator(mode="after")
    def _statement_within_retry_budget(self) -> Self:
        database = self.database
        if database.statement_timeout_seconds >= self.deadlines.retry_budget_seconds:
            raise ValueError(
                not_less(
                    (
                        DatabaseSettings,
                        "statement_timeout_seconds",
                        database.statement_timeout_seconds,
                    ),
                    (DeadlineSettings, "retry_budget_seconds", self.deadlines.retry_budget_seconds),
                )
            )
        return self


GROUPS: dict[str, type[SettingsGroup]] = {
    name: field.annotation  # type: ignore[misc]
    for name, field in Settings.model_fields.items()
}
"""Each group of :class:`Settings` by its attribute name, in the order of the reference."""


def variables() -> Iterator[tuple[type[SettingsGroup], str, str]]:
    """``(group, field, variable)`` of every setting, in the order of the reference."""
    for group in GROUPS.values():
        for field in group.model_fields:
            yield group, field, env_name(group, field)


def from_variables(values: Mapping[str, object]) -> Settings:
    """The settings that ``values`` give, defaults for the rest, reading no environment or file.

    Args:
        values: ``{VARIABLE: value}``, e.g. ``{"FULFILMENT_PREFETCH_COUNT": "8"}``, names in
            any case; a value as the environment would give it, or already typed.

    Raises:
        KeyError: a name that is no setting's variable.
        pydantic.ValidationError: a value or a rule across values is refused (its ``loc`` is
            the field of the group, not the variable).
    """
    fields = {
        env_name(group, field): (attribute, field)
        for attribute, group in GROUPS.items()
        for field in group.model_fields
    }
    given: dict[str, dict[str, object]] = {attribute: {} for attribute in GROUPS}
    for name, value in values.items():
        attribute, field = fields[name.upper()]
        given[attribute][field] = value
    # model_validate skips the settings sources: only these values and the defaults count.
    return Settings.model_validate(
        {attribute: GROUPS[attribute].model_validate(given[attribute]) for attribute in GROUPS}
    )


def load_settings() -> Settings:
    """Read and validate the settings from the environment (and ``.env``, if present).

    The environment wins over ``.env`` (pydantic-settings); a ``.env`` line whose value is
    invalid is refused all the same, though the environment overrides it, so that the file
    does not hold a value that breaks the start once the environment's is gone.

    Raises:
        SettingsError: one line per invalid or unknown variable, each naming it and saying why
            (and the ``.env`` file, for a key of that file: with its line for a bad value), or
            per line of ``.env`` that cannot be read, or that ``.env`` is not a file.
    """
    known = {name for _, _, name in variables()}
    reading = read_env_file(known, ENV_FILE, ENV_FILE_ENCODING)
    if reading.misread:
        raise SettingsError("\n".join(reading.misread))
    unknown = unknown_variables(os.environ, known) + reading.unknown
    if unknown:
        raise SettingsError("\n".join(unknown))
    # Names in any case, as pydantic-settings reads them.
    from_environment = {name.upper() for name in os.environ}
    lines: list[str] = []
    groups: dict[str, SettingsGroup] = {}
    for attribute, group in GROUPS.items():
        lines += _overridden_in_env_file(group, reading, from_environment)
        try:
            groups[attribute] = group()
        except ValidationError as error:
            lines += _said(error, group, reading, from_environment)
    if not lines:
        try:
            return Settings(**groups)  # type: ignore[arg-type]
        except ValidationError as error:
            lines += [problem["msg"].removeprefix("Value error, ") for problem in error.errors()]
    raise SettingsError("\n".join(lines)) from None


def _said(
    error: ValidationError,
    group: type[SettingsGroup],
    reading: EnvFileReading,
    from_environment: set[str],
) -> list[str]:
    """A line per problem of ``group``, each naming its variable and, for ``.env``'s, the line."""
    lines = []
    for problem in error.errors():
        field = ".".join(str(part) for part in problem["loc"])
        message = problem["msg"].removeprefix("Value error, ")
        if not field:
            # A rule across fields (the nesting of deadlines) names its variables itself.
            lines.append(message)
            continue
        name = env_name(group, field)
        where = reading.lines.get(name) if name not in from_environment else None
        lines.append(f"{where}: {name}: {message}" if where else f"{name}: {message}")
    return lines


def _overridden_in_env_file(
    group: type[SettingsGroup], reading: EnvFileReading, from_environment: set[str]
) -> list[str]:
    """A line per ``.env`` value of ``group`` that is invalid, where the environment overrides it.

    pydantic-settings never reads such a line, so it would break the start only on the day
    the environment's variable goes away; it is said now, at its line.
    """
    prefix = str(group.model_config.get("env_prefix", ""))
    values: dict[str, Any] = {
        field: reading.values[name]
        for field in group.model_fields
        if (name := env_name(group, field)) in from_environment and name in reading.values
    }
    if not values:
        return []
    try:
        group.model_validate(values)  # reads no environment: the file's values alone
    except ValidationError as error:
        return [
            f"{reading.lines[name]}: {name}: {problem['msg'].removeprefix('Value error, ')}"
            " (the environment's value overrides this line, but fix or remove it)"
            for problem in error.errors()
            if problem["loc"] and (name := f"{prefix}{problem['loc'][0]}".upper()) in reading.lines
        ]
    return []
