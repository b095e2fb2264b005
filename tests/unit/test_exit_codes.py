"""The exit statuses every program shares (``fulfilment.exit_codes``)."""

from __future__ import annotations

import ast
from pathlib import Path

from fulfilment import exit_codes
from fulfilment.exit_codes import ExitCode


def test_the_exit_codes_keep_their_numbers() -> None:
    assert {code.name: int(code) for code in ExitCode} == {
        "OK": 0,
        "FAILED": 1,
        "BAD_INPUT": 2,
        "UNAVAILABLE": 3,
        "REFUSED": 4,
        "INTERRUPTED": 130,
    }


def test_the_exit_codes_module_imports_nothing_of_the_service() -> None:
    tree = ast.parse(Path(exit_codes.__file__).read_text())
    imported = {
        node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }

    assert imported <= {"__future__", "enum"}
