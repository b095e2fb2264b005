"""Where a file stops being UTF-8: a leaf, for the readers of ``.env``, stock and data-set files.

Each reader names the line of the first bad byte (``FILE:LINE: not UTF-8 ...``). A file read
as a text stream cannot tell it from the :class:`UnicodeDecodeError` alone: the stream decodes
its file in chunks, and the error's offset counts from the start of the chunk (and after a
byte-order mark), not of the file. :func:`not_utf8` looks again at the whole file's bytes, once
the reading has failed, so that a good file is read once. :func:`at_line` is the one way all
three readers name a place in a file.
"""

from __future__ import annotations

from pathlib import Path


def at_line(name: str | Path, line: int | None, problem: str) -> str:
    """``NAME:LINE: problem``, or ``NAME: problem`` when ``line`` is None (the whole file).

    The compiler-style place that editors and terminals turn into a link; ``line`` is 1-based.
    """
    return f"{name}:{line}: {problem}" if line is not None else f"{name}: {problem}"


def not_utf8(path: Path, error: UnicodeDecodeError) -> tuple[int | None, str]:
    """``(line, problem)`` of ``path``, whose reading as UTF-8 text raised ``error``.

    ``line`` is the 1-based line of the first byte that is not UTF-8 (one more than the line
    feeds before it), and ``problem`` reads ``not UTF-8 (invalid start byte at byte 4 of the
    line)``, the byte counted in its line from 1. A byte-order mark is UTF-8 (U+FEFF) and counts
    as bytes of the first line. When the file reads as UTF-8 now (it changed since), ``line``
    is None and ``problem`` gives ``error``'s reason alone.

    Raises:
        OSError: the file cannot be read again.
    """
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as found:
        start = found.start
        column = start - data.rfind(b"\n", 0, start)
        line = data.count(b"\n", 0, start) + 1
        return line, f"not UTF-8 ({found.reason} at byte {column} of the line)"
    return None, f"not UTF-8 ({error.reason})"
