"""Where a file stops being UTF-8: a leaf, for the readers of ``.env``, stock and data-set files.

Each reader names the line of the first bad byte (``FILE:LINE: not UTF-8 ...``). A file read
as a text stream cannot tell it from the :class:`UnicodeDecodeError` alone: the stream decodes
its file in chunks, and the error's offset counts from the start of the chunk (and after a
byte-order mark), not of the file. :func:`first_non_utf8` looks again at the whole file's
bytes.
"""

from __future__ import annotations

from typing import NamedTuple


class NonUtf8(NamedTuple):
    """The first byte of a file that is not UTF-8.

    Attributes:
        line: its 1-based line: one more than the line feeds before it.
        column: its 1-based byte in that line, as an editor that shows bytes counts it.
        offset: its 0-based offset in the file.
        reason: the codec's words, such as ``invalid start byte``.
    """

    line: int
    column: int
    offset: int
    reason: str


def first_non_utf8(data: bytes) -> NonUtf8 | None:
    """Where ``data`` (a whole file) first stops being UTF-8, or None if it is UTF-8 throughout.

    A byte-order mark is UTF-8 (U+FEFF), so offsets count from the file's first byte with or
    without one.
    """
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        start = error.start
        line_start = data.rfind(b"\n", 0, start) + 1
        return NonUtf8(data.count(b"\n", 0, start) + 1, start - line_start + 1, start, error.reason)
    return None
