"""The references generated from the code are current, and the generator reads the code itself.

``make docs`` (``scripts/render-docs``) writes the sections of ``docs/configuration.md`` and
``.env.example`` from the docstrings of the settings' groups and fields, and the reference of
``docs/cli.md`` from the typer app. A setting, a docstring, a default, a command or an option
changed without ``make docs`` fails here.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import Field

from fulfilment.settings import GROUPS, Settings, WorkerSettings, env_name, variables

ROOT = Path(__file__).parents[2]


def _load_script() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("render_docs", str(ROOT / "scripts/render-docs"))
    spec = importlib.util.spec_from_loader("render_docs", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


render_docs = _load_script()


@pytest.mark.parametrize(
    "path", [".env.example", "docs/configuration.md", "docs/cli.md"], ids=lambda path: path
)
def test_the_committed_file_is_what_the_code_renders(path: str) -> None:
    expected = render_docs.rendered()[ROOT / path]

    assert (ROOT / path).read_text(encoding="utf-8") == expected, f"{path}: run `make docs`"


def test_the_configuration_reference_has_a_section_per_group_and_a_row_per_setting() -> None:
    table = render_docs.configuration_table()

    rows = re.findall(r"^\| `(FULFILMENT_[A-Z0-9_]+)` \|", table, re.MULTILINE)
    assert rows == [name for _, _, name in variables()]
    headings = re.findall(r"^## (.+)$", table, re.MULTILINE)
    assert headings == [field.title for field in Settings.model_fields.values()]
    for heading, group in zip(headings, GROUPS.values(), strict=True):
        section = table.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
        assert re.findall(r"^\| `(FULFILMENT_[A-Z0-9_]+)` \|", section, re.MULTILINE) == [
            env_name(group, field) for field in group.model_fields
        ]


def test_the_env_example_sets_every_setting_to_its_default() -> None:
    lines = (ROOT / ".env.example").read_text(encoding="utf-8").splitlines()
    assignments = dict(
        line.removeprefix("# ").split("=", 1)
        for line in lines
        if re.match(r"(# )?FULFILMENT_[A-Z0-9_]+=", line)
    )

    assert list(assignments) == [name for _, _, name in variables()]
    for group, field, name in variables():
        value = getattr(group.model_validate({}), field)
        written = assignments[name]
        parsed = group.model_validate({field: written} if written else {})
        assert getattr(parsed, field) == value, name


def test_a_setting_that_follows_another_is_commented_out_and_says_so() -> None:
    text = (ROOT / ".env.example").read_text(encoding="utf-8")

    followers = {
        title: found
        for title, group in render_docs.groups(Settings).items()
        if (found := render_docs.followers(group))
    }
    assert followers == {"Worker": {"reservation_batch_max": "prefetch_count"}}
    assert "\n# FULFILMENT_RESERVATION_BATCH_MAX=64\n" in text
    assert "| `FULFILMENT_RESERVATION_BATCH_MAX` | `FULFILMENT_PREFETCH_COUNT` (`64`) |" in (
        render_docs.configuration_table()
    )


class _MoreWorkerSettings(WorkerSettings):
    """The worker's settings with one more field, as a later change would add it."""

    example_window_seconds: float = Field(default=2.5, gt=0)
    """How long the example waits, in seconds."""


class _MoreSettings(Settings):
    """Settings whose worker group has one more field."""

    worker: _MoreWorkerSettings = Field(default_factory=_MoreWorkerSettings, title="Worker")


class _UndocumentedWorkerSettings(WorkerSettings):
    """The worker's settings with a field that has no docstring."""

    example_undocumented: int = 1


class _UndocumentedSettings(Settings):
    """Settings whose worker group has a field without a docstring."""

    worker: _UndocumentedWorkerSettings = Field(
        default_factory=_UndocumentedWorkerSettings, title="Worker"
    )


def test_a_new_field_gets_its_row_and_its_line_from_its_docstring() -> None:
    table = render_docs.configuration_table(_MoreSettings)
    example = render_docs.env_example(_MoreSettings)

    assert (
        "| `FULFILMENT_EXAMPLE_WINDOW_SECONDS` | `2.5` | > 0 | How long the example waits,"
        " in seconds. |"
    ) in table
    assert "# How long the example waits, in seconds.\nFULFILMENT_EXAMPLE_WINDOW_SECONDS=2.5\n" in (
        example
    )


def test_a_field_without_a_docstring_stops_the_rendering() -> None:
    with pytest.raises(ValueError, match="FULFILMENT_EXAMPLE_UNDOCUMENTED"):
        render_docs.configuration_table(_UndocumentedSettings)


def test_the_cli_reference_has_every_command_of_the_app() -> None:
    reference = render_docs.cli_reference()

    for command in ("worker", "relay", "migrate", "prune", "dlq replay", "outbox prune"):
        assert f"`fulfilment {command}`" in reference
    assert "`--confirm-reset" in reference
