"""The releases recorded in ``releases.toml`` agree with the CHANGELOG, git and this tree's
version, so that ``make test-upgrade`` finds the previous release and the version says which
code runs."""

from __future__ import annotations

import re
import subprocess
import tomllib

import pytest
from packaging.version import Version

import fulfilment
from fulfilment.adapters.postgres.advisory_lock import DISPATCHER_LOCK_KEY, RELAY_LOCK_KEY
from tests.upgrade.upgradelib import ROOT, head_version, previous_release, recorded_releases


def test_the_releases_are_recorded_oldest_first_each_with_its_whole_commit() -> None:
    releases = recorded_releases()

    assert releases, "releases.toml records no release"
    versions = [Version(release.version) for release in releases]
    assert versions == sorted(versions)
    assert len(set(versions)) == len(versions)
    assert all(re.fullmatch(r"[0-9a-f]{40}", release.commit) for release in releases)
    assert len({release.commit for release in releases}) == len(releases)


def test_this_tree_is_a_version_after_the_last_release() -> None:
    # Between releases the version is the next one's development release (0.3.0.dev0), so
    # that `--version`, the start-up lines and fulfilment_build_info tell it from the release.
    last = recorded_releases()[-1]

    assert Version(head_version()) > Version(last.version)
    assert previous_release(head_version(), recorded_releases()) == last


def test_the_installed_version_is_this_trees() -> None:
    assert fulfilment.__version__ == head_version()


def test_each_release_has_its_changelog_heading_naming_its_date_and_commit() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## \[([^\]]+)\](.*)$", changelog, re.MULTILINE)

    assert headings[0] == ("Unreleased", "")
    for release in recorded_releases():
        wanted = f" - {release.date.isoformat()} - commit {release.short}"
        assert (release.version, wanted) in headings, f"CHANGELOG: ## [{release.version}]{wanted}"
    assert len(headings) == len(recorded_releases()) + 1


FIRST_SECTION_KEPT_AS_RELEASED = Version("0.2.0")
"""0.1.0's section was written after its release, as a summary; from 0.2.0 on a release's
section is what its commit's CHANGELOG said under ``## [Unreleased]``."""


def changelog_section(text: str, heading: str) -> str:
    """The lines under the ``## `` heading that starts with ``heading``, up to the next one."""
    sections = re.split(r"^## ", text, flags=re.MULTILINE)
    found = [section for section in sections if section.startswith(heading)]
    assert len(found) == 1, f"CHANGELOG: {len(found)} sections ## {heading}"
    return found[0].partition("\n")[2].strip()


def test_each_release_section_is_what_its_commit_called_unreleased() -> None:
    # A merge of a branch that added a line under Unreleased before the release was recorded
    # puts the line where its context is, in the release's section: this finds it there.
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    for release in recorded_releases():
        if Version(release.version) < FIRST_SECTION_KEPT_AS_RELEASED:
            continue
        shown = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{release.commit}:CHANGELOG.md"],
            capture_output=True,
            text=True,
            check=False,
        )
        if shown.returncode != 0:
            pytest.skip(f"commit {release.short} is not in this clone (a shallow one)")
        assert changelog_section(changelog, f"[{release.version}]") == changelog_section(
            shown.stdout, "[Unreleased]"
        ), f"CHANGELOG: the section of {release.version} differs from {release.short}'s Unreleased"


def test_each_release_commit_carries_its_version_where_the_history_is_here() -> None:
    for release in recorded_releases():
        shown = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{release.commit}:pyproject.toml"],
            capture_output=True,
            check=False,
        )
        if shown.returncode != 0:
            pytest.skip(f"commit {release.short} is not in this clone (a shallow one)")
        pyproject = tomllib.loads(shown.stdout.decode())
        assert pyproject["project"]["version"] == release.version


LOCK_KEYS = {
    "RELAY_LOCK_KEY": ("src/fulfilment/adapters/postgres/advisory_lock.py", RELAY_LOCK_KEY),
    "DISPATCHER_LOCK_KEY": (
        "src/fulfilment/adapters/postgres/advisory_lock.py",
        DISPATCHER_LOCK_KEY,
    ),
}


@pytest.mark.parametrize("name", sorted(LOCK_KEYS))
def test_an_advisory_lock_key_is_the_previous_releases(name: str) -> None:
    # A relay or dispatcher of this tree must stand by while the previous release's holds the
    # lock during a rolling update (docs/development.md, "Changing the schema, the topology or
    # a wire model"). Where the previous release has no such lock, there is nothing to match.
    path, key = LOCK_KEYS[name]
    previous = previous_release(head_version(), recorded_releases())
    files = subprocess.run(
        ["git", "-C", str(ROOT), "grep", "-h", f"^{name} = ", previous.commit, "--", "src"],
        capture_output=True,
        text=True,
        check=False,
    )
    if files.returncode == 128:  # git's code for a commit it does not have
        pytest.skip(f"commit {previous.short} is not in this clone (a shallow one)")
    found = re.findall(rf"^{name} = (\S+)", files.stdout, re.MULTILINE)
    assert all(int(value, 0) == key for value in found), (path, found, hex(key))
