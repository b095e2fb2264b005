"""Helpers of the upgrade suite: the recorded releases, a release installed from its commit, the
pause read from the database, and the table of figures.

A release is recorded in ``releases.toml`` (version, commit, date; a tag may not travel with a
clone). :func:`install_release` builds one from git (``git archive`` of its commit) into a
folder of its own and installs it with uv from that commit's own ``uv.lock`` into an
environment of its own (``UV_PROJECT_ENVIRONMENT``), so its processes run the code and the
dependencies it was released with, beside this tree's.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import asyncpg
import pytest
from packaging.version import Version

ROOT = Path(__file__).parents[2]
RELEASES_FILE = ROOT / "releases.toml"

TABLES: list[str] = []
"""The figures' tables of the session's runs, which ``conftest`` prints at its end."""


@dataclass(frozen=True)
class Release:
    """One entry of ``releases.toml``."""

    version: str
    commit: str
    """The full hash of the commit the release was cut from."""
    date: date

    @property
    def short(self) -> str:
        return self.commit[:7]


def recorded_releases(path: Path = RELEASES_FILE) -> list[Release]:
    """The releases of ``path``, in the file's order (oldest first)."""
    entries = tomllib.loads(path.read_text(encoding="utf-8")).get("release", [])
    return [Release(str(e["version"]), str(e["commit"]), e["date"]) for e in entries]


def head_version(root: Path = ROOT) -> str:
    """The version of this tree (``pyproject.toml``)."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    return str(pyproject["project"]["version"])


def previous_release(head: str, releases: list[Release]) -> Release:
    """The newest recorded release older than ``head`` (PEP 440 order).

    Raises:
        LookupError: none is older.
    """
    older = [release for release in releases if Version(release.version) < Version(head)]
    if not older:
        msg = f"releases.toml records no release before {head}"
        raise LookupError(msg)
    return max(older, key=lambda release: Version(release.version))


def git(*args: str, root: Path = ROOT) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=False)


def head_commit(root: Path = ROOT) -> str:
    """This tree's commit, short, with ``+changes`` when the work tree differs from it."""
    commit = git("rev-parse", "--short=7", "HEAD", root=root).stdout.decode().strip() or "?"
    dirty = git("diff", "--quiet", "HEAD", root=root).returncode != 0
    return f"{commit}+changes" if dirty else commit


def uv_binary() -> str:
    """uv: the one running this session (``uv run`` sets ``UV``), on PATH, or the Makefile's."""
    for candidate in (os.environ.get("UV"), shutil.which("uv"), str(ROOT / ".tools/bin/uv")):
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.fail("uv is needed to install the previous release (make install puts it in .tools)")


@dataclass(frozen=True)
class InstalledRelease:
    """A release built from its commit and installed in an environment of its own."""

    release: Release
    source: Path
    """The release's files, as ``git archive`` of its commit wrote them."""
    python: str
    """The environment's interpreter: ``python -m fulfilment`` is the release's worker."""

    @property
    def fulfilment(self) -> str:
        """The release's ``fulfilment`` program."""
        return str(Path(self.python).with_name("fulfilment"))


def install_release(release: Release, folder: Path, root: Path = ROOT) -> InstalledRelease:
    """Build ``release`` from its commit into ``folder``/src and install it, with its own lock
    file, into ``folder``/venv (``uv sync --frozen --no-dev``; uv's cache makes a second
    install take seconds).

    Fails the test (``pytest.fail``) when the commit is not in this clone (a shallow clone: CI
    must fetch the whole history) or the install fails.
    """
    if git("cat-file", "-e", f"{release.commit}^{{commit}}", root=root).returncode != 0:
        pytest.fail(
            f"release {release.version}'s commit {release.commit} (releases.toml) is not in "
            "this clone: the upgrade test builds the previous release from git, so it needs the "
            "whole history (git fetch --unshallow, or a clone without --depth)",
            pytrace=False,
        )
    archive = git("archive", "--format=tar", release.commit, root=root)
    if archive.returncode != 0:
        pytest.fail(f"git archive {release.commit}: {archive.stderr.decode()}", pytrace=False)
    source = folder / "src"
    source.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as files:
        files.extractall(source, filter="data")
    venv = folder / "venv"
    env = {
        k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "UV_RUN_RECURSION_DEPTH"}
    }
    env["UV_PROJECT_ENVIRONMENT"] = str(venv)
    installed = subprocess.run(
        [uv_binary(), "sync", "--frozen", "--no-dev", "--compile-bytecode", "--quiet"],
        cwd=source,
        env=env,
        capture_output=True,
        check=False,
        timeout=600,
    )
    if installed.returncode != 0:
        pytest.fail(
            f"installing release {release.version} ({release.short}) with uv failed: "
            f"{installed.stderr.decode(errors='replace')[-2000:]}",
            pytrace=False,
        )
    return InstalledRelease(release, source, str(venv / "bin" / "python"))


THIS_TREE = sys.executable
"""The interpreter of this tree's environment: the new release's programs."""


async def longest_gap(db: asyncpg.Connection, table: str, column: str) -> float:
    """The longest stretch, in seconds, between two successive values of ``table.column`` (a
    timestamp set in the transaction that wrote the row): the longest pause in commits."""
    seconds = await db.fetchval(
        f"SELECT coalesce(max(gap), 0) FROM (SELECT extract(epoch FROM {column}"  # noqa: S608 - the test's own names
        f" - lag({column}) OVER (ORDER BY {column})) AS gap FROM {table}"
        f" WHERE {column} IS NOT NULL) AS gaps"
    )
    return round(float(seconds), 2)


def table(title: str, rows: list[tuple[str, object]]) -> str:
    """``rows`` as a two-column Markdown table under ``title``."""
    width = max(len(name) for name, _ in rows)
    lines = [title, "", f"| {'figure'.ljust(width)} | value |", f"|{'-' * (width + 2)}|-------|"]
    lines += [f"| {name.ljust(width)} | {value} |" for name, value in rows]
    return "\n".join(lines)
