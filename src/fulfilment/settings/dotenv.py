"""What is wrong with the ``FULFILMENT_*`` variables and the ``.env`` file, said one line each.

A misspelt variable, a ``.env`` line that python-dotenv would skip or misread, a file that is
not UTF-8 or not a file at all: each would otherwise leave a setting at its default in silence,
and a command run against the default database. The settings (``fulfilment.settings``) give
the names they know; this module names no setting itself.
"""

from __future__ import annotations

import difflib
import io
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import NamedTuple

from dotenv.parser import Original, parse_stream

from fulfilment.utf8 import at_line, not_utf8

ENV_PREFIX = "FULFILMENT_"
"""The prefix of every setting's environment variable."""

ENV_FILE = ".env"
"""The file the settings also read, from the working directory; the environment wins over it."""

NOT_SETTINGS_PREFIXES = (f"{ENV_PREFIX}TEST_", f"{ENV_PREFIX}BENCH_")
"""Variables of the test suite and the benchmark, which share the prefix but are not settings."""


def unknown_variables(
    environ: Mapping[str, str | None],
    known: Collection[str],
    places: Mapping[str, str] | None = None,
) -> list[str]:
    """One line per ``FULFILMENT_*`` variable that is no setting, with the likely intended one.

    A misspelt variable (``FULFILMENT_PREFTCH_COUNT``) would otherwise be ignored in silence
    and the default used, which an operator finds out only in production.

    Args:
        environ: the variables, names in any case.
        known: every setting's variable, in upper case.
        places: ``{NAME: "FILE:LINE"}`` of variables read from a file: a line about one of
            them starts with its place, as the file's other problems do.
    """
    problems = []
    for name in sorted(key.upper() for key in environ):
        if (
            not name.startswith(ENV_PREFIX)
            or name in known
            or name.startswith(NOT_SETTINGS_PREFIXES)
        ):
            continue
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        where = f"{places[name]}: " if places and name in places else ""
        problems.append(f"{where}{name}: not a setting of this service{hint}")
    return problems


class EnvFileReading(NamedTuple):
    """What one reading of the ``.env`` file found (:func:`read_env_file`).

    Attributes:
        misread: the lines that would not set what they seem to, numbered; or the one line
            saying the file is not UTF-8, or not a file.
        unknown: as :func:`unknown_variables` says them, its ``FULFILMENT_*`` keys that are no
            setting, each naming the file and the line that sets it.
        lines: ``{NAME: "FILE:LINE"}`` of every ``FULFILMENT_*`` key it sets, names in upper
            case, the last line of a name that appears twice (the one that takes effect).
        values: ``{NAME: value}`` of the same keys, as the settings would read them.
    """

    misread: list[str]
    unknown: list[str]
    lines: dict[str, str]
    values: dict[str, str]


def read_env_file(
    known: Collection[str], name: str = ENV_FILE, encoding: str = "utf-8"
) -> EnvFileReading:
    """What is wrong with the ``.env`` file ``name``, from one reading of it.

    Args:
        known: every setting's variable, in upper case.
        name: the file, relative to the working directory as the settings find it.
        encoding: the file's encoding, as the settings read it.

    Returns:
        Its misread lines, its unknown keys, where each key is set and to what; all empty
        without the file (:class:`EnvFileReading`).

    python-dotenv, the parser pydantic-settings reads the file with and the one used here,
    skips a line that is no ``NAME=VALUE`` (an unclosed quote) with a logged warning and reads
    on, reads a bare ``NAME`` as no value, and lets a quote closed on a later line take the
    lines between into the value: in each case the variable would take the environment's
    value, its default or a mangled one, and a command could run against the default database
    instead of the one the line names. pydantic-settings also passes over a ``.env`` that is a
    folder. A file that is not UTF-8 is a problem too, rather than a traceback, named at the
    line of its first bad byte. No value is shown, since one may hold a password.
    """
    misread: list[str] = []
    lines: dict[str, str] = {}
    values: dict[str, str] = {}
    path = Path(name).expanduser()
    if path.is_dir():
        misread.append(
            at_line(name, None, "is a folder, not a file of NAME=VALUE lines: remove or rename it")
        )
        return EnvFileReading(misread, [], lines, values)
    if not path.is_file():
        return EnvFileReading(misread, [], lines, values)
    try:
        text = path.read_text(encoding=encoding)
    except UnicodeDecodeError as error:
        bad_line, problem = not_utf8(path, error)
        misread.append(at_line(name, bad_line, problem))
        return EnvFileReading(misread, [], lines, values)
    keys: dict[str, str | None] = {}
    for binding in parse_stream(io.StringIO(text)):
        where = f"{name}:{_first_line(binding.original)}"
        if binding.error:
            line = binding.original.string
            hint = " (an unclosed quote?)" if any(quote in line for quote in "'\"") else ""
            misread.append(
                f"{where}: {_line_start(line)} cannot be read as NAME=VALUE{hint}: fix or remove it"
            )
        elif binding.key is None or not binding.key.upper().startswith(ENV_PREFIX):
            continue
        elif binding.value is None:
            misread.append(f"{where}: {binding.key} has no =VALUE: give it one or remove it")
        elif "\n" in binding.value:
            misread.append(
                f"{where}: {binding.key}'s quoted value runs onto the next lines (a quote"
                " closed on a later line?): no setting takes a line break"
            )
        else:
            keys[binding.key] = binding.value
            lines[binding.key.upper()] = where
            values[binding.key.upper()] = binding.value
    return EnvFileReading(misread, unknown_variables(keys, known, lines), lines, values)


def _first_line(original: Original) -> int:
    """The line where a binding's text starts, past the blank lines python-dotenv gives it.

    The parser counts the blank lines before a binding as the binding's own (its ``line`` is the
    first of them), so a line number taken as it is would name a blank line above the one meant.
    """
    text = original.string
    return original.line + text[: len(text) - len(text.lstrip())].count("\n")


def _line_start(line: str) -> str:
    """The variable an unreadable ``.env`` line meant to set, or "the line" when none shows."""
    name = line.partition("=")[0].strip().removeprefix("export ").strip()
    return name if name.isidentifier() else "the line"
