"""The README and the pages of ``docs/`` hold together: links land, and the README's commands run.

- every relative link of ``README.md`` and ``docs/*.md`` names a file of the repository and,
  with ``#anchor``, a heading of that page (GitHub's anchors), so that a reader, or an alert's
  ``runbook_url``, is one click from the text;
- every page of ``docs/`` is listed by the index, ``docs/README.md``;
- every ``make`` target the README's commands name is a target of the Makefile, and every
  ``fulfilment`` command parses with the command line's own parser (nothing is run).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer.main
from typer.core import TyperGroup

from fulfilment.entrypoints import cli

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of every heading of ``page`` (outside code blocks)."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {github_anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def links(page: Path) -> list[str]:
    """The link targets of ``page`` outside code blocks."""
    return LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8")))


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_lands_on_a_file_and_a_heading(page: Path) -> None:
    problems = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue  # https://, mailto: ...
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            problems.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            problems.append(f"{target}: no such heading")
    assert problems == []


def test_the_index_lists_every_page() -> None:
    index = ROOT / "docs/README.md"
    listed = {(index.parent / target.partition("#")[0]).resolve() for target in links(index)}

    for page in (ROOT / "docs").iterdir():
        if page != index and page.suffix in {".md", ".json"}:
            assert page.resolve() in listed, f"docs/README.md does not list {page.name}"


def test_a_link_to_a_missing_heading_is_found() -> None:
    assert "no-such-heading" not in anchors(ROOT / "docs/runbook.md")
    assert "fulfilmentnoconsumers" in anchors(ROOT / "docs/runbook.md")


def readme_commands() -> list[list[str]]:
    """The README's shell commands (```bash blocks), as words, without comments, ``>`` and ``&``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        for line in block.splitlines():
            words = [w for w in shlex.split(line, comments=True) if not re.match(r"\d*>", w)]
            if words and words[-1] == "&":
                words.pop()
            if words:
                commands.append(words)
    return commands


def make_targets() -> set[str]:
    """The targets the Makefile defines."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([a-zA-Z0-9_-]+):", text, re.MULTILINE))


def parse_problem(arguments: list[str]) -> str | None:
    """Why ``fulfilment ARGUMENTS`` would not parse, or None; no command is run."""
    command = typer.main.get_command(cli.app)
    commands = [command]
    while commands:
        each = commands.pop()
        if isinstance(each, TyperGroup):
            commands.extend(each.commands.values())
        else:
            each.callback = lambda **_: None
    try:
        command.main(arguments, prog_name="fulfilment", standalone_mode=False)
    except Exception as error:  # noqa: BLE001 - every parse failure is the problem to report
        return f"fulfilment {shlex.join(arguments)}: {type(error).__name__}: {error}"
    return None


def test_the_readme_commands_name_make_targets_and_commands_that_parse() -> None:
    commands = readme_commands()
    problems = []
    for words in commands:
        if words[0] == "make":
            problems += [
                f"make {word}: no such target"
                for word in words[1:]
                if "=" not in word and word not in make_targets()
            ]
        elif words[:3] == ["uv", "run", "fulfilment"]:
            problem = parse_problem(words[3:])
            problems += [problem] if problem else []

    assert ["make", "demo"] in commands
    assert ["make", "test"] in commands
    assert any(words[:3] == ["uv", "run", "fulfilment"] for words in commands)
    assert problems == []


def test_a_command_that_does_not_parse_is_found() -> None:
    assert parse_problem(["migrate", "--no-such-option"]) is not None
    assert parse_problem(["stock", "load", "data/sample/stock.csv"]) is None
