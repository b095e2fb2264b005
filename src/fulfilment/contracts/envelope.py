"""What every input event of the contract shares (docs/events.md, "Example messages").

Every event (``OrderPlaced``, and the events of the reservation lifecycle after it) is a JSON
object in UTF-8 carrying its own ``event_id``, the idempotency key, and the ``order_id`` it is
about. Each event type has its strict model beside this module (``order_placed``); the
envelope is read leniently, for what the worker needs before or without that model.

A body is also held to the JSON that every parser reads the same way (I-JSON, RFC 7493), by
:func:`find_ambiguity`: the model's parser alone keeps the last of duplicate keys and reads
``true`` or ``1.0`` as the literal ``1``, where another consumer of the same message would
read something else or refuse it.
"""

from __future__ import annotations

import functools
import json
import math
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, ValidationError

JSON_CONTENT_TYPES = frozenset({"", "application/json", "text/json"})
"""Content types accepted for an event body; empty means the producer sent none."""

MAX_BODY_BYTES = 1_048_576
"""A body larger than 1 MiB is refused before parsing, whatever the event; the largest
``OrderPlaced`` the contract allows (1,000 lines) fits in about 60 KiB."""


class EventEnvelope(BaseModel):
    """The ids of an event, read without the event type's own rules (unknown fields ignored)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    event_id: UUID
    order_id: UUID | None = None


def read_envelope(body: bytes) -> EventEnvelope | None:
    """The envelope of ``body``, or None when ``body`` is not a JSON object with an event id."""
    try:
        return EventEnvelope.model_validate_json(body)
    except ValidationError:
        return None


MAX_EXACT_INTEGER = 2**53 - 1
"""The largest integer every JSON parser reads exactly: those that read numbers as IEEE 754
doubles (JavaScript's, among others) round beyond it (RFC 7493, section 2.2)."""

_DIGITS_AS_ZEROS = bytes.maketrans(b"123456789", b"000000000")
_SIXTEEN_DIGITS = b"0" * len(str(MAX_EXACT_INTEGER))
"""Found in a body whose digits were all made zeros where it has an integer as long as
:data:`MAX_EXACT_INTEGER` or longer: ten times faster than a regular expression."""

_SHOWN_DIGITS = 30
"""Digits of an over-large integer quoted in a reason: a reason is one short line."""

_ITEM = "[]"
"""A path step into every item of an array (``lines.[].quantity``)."""


class _AmbiguityError(ValueError):
    """Raised from inside ``json.loads`` hooks; the message is the one-line reason."""


def find_ambiguity(body: bytes, model: type[BaseModel]) -> str | None:
    """What makes ``body`` read differently by another JSON parser, or None if nothing does.

    Meant for a body the model's own parser accepted (``model_validate_json``), which already
    refuses invalid UTF-8, lone surrogates, a byte-order mark, control characters, trailing
    text and deep nesting. This adds, anywhere in the body, known fields or not:

    * a key twice in one object (the model's parser keeps the last, others the first or
      refuse);
    * ``NaN``, ``Infinity`` and ``-Infinity``, which are not JSON, and numbers beyond the
      range of a double (``1e400``);
    * integers beyond +-:data:`MAX_EXACT_INTEGER`;

    and, where the model expects an integer (its JSON schema says ``integer``: counts and
    literals such as ``version``), ``true``, ``false`` or a number written with a fraction or
    an exponent (``1.0``, ``1e0``): strict pydantic refuses them for an ``int`` field but
    accepts them for ``Literal[1]``.

    Costs one more parse of the body (``json.loads`` with a hook per object): about 6 us for
    a 3-line ``OrderPlaced`` and 0.33 ms for one of 675 lines, the largest of the Online Retail
    data, beside 2.5 us and 0.27 ms for the model's own validation.
    """
    try:
        text = body.decode("utf-8")
        # A Python call per integer doubles the cost of a large order; an integer can only be
        # out of range where 16 digits follow each other, which few bodies have.
        long_digits = body.translate(_DIGITS_AS_ZEROS).find(_SIXTEEN_DIGITS) >= 0
        decoder = _CHECKING_INTEGERS if long_digits else _CHECKING
        # json.loads(text) refuses a byte-order mark before decoding; JSONDecoder.decode alone
        # would not.
        document = json.loads(text) if text.startswith("\ufeff") else decoder.decode(text)
    except _AmbiguityError as error:
        return str(error)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        return f"not JSON: {' '.join(str(error).split())}"
    for path in _integer_paths(model):
        for value in _values_at(document, path):
            if isinstance(value, (bool, float)):
                where = ".".join(path)
                return f"{where}: {json.dumps(value)} where an integer is expected"
    return None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        counts = Counter(key for key, _ in pairs)
        duplicate = next(key for key, count in counts.items() if count > 1)
        msg = f"key {duplicate!r} appears twice in one object"
        raise _AmbiguityError(msg)
    return document


def _no_constant(name: str) -> float:
    msg = f"{name} is not a JSON number"
    raise _AmbiguityError(msg)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        msg = f"the number {text} is beyond the range of a double"
        raise _AmbiguityError(msg)
    return value


def _exact_integer(text: str) -> int:
    # Checked on the digits first: Python refuses to convert more than 4,300 of them.
    digits = len(text.lstrip("-"))
    if digits > len(str(MAX_EXACT_INTEGER)) or abs(value := int(text)) > MAX_EXACT_INTEGER:
        shown = text if digits <= _SHOWN_DIGITS else f"{text[:_SHOWN_DIGITS]}... ({digits} digits)"
        msg = f"the integer {shown} is beyond +-(2**53 - 1), which not every parser reads exactly"
        raise _AmbiguityError(msg)
    return value


# Built once: json.loads with hooks builds a decoder, and its scanner, on every call.
_CHECKING = json.JSONDecoder(
    object_pairs_hook=_unique_keys, parse_constant=_no_constant, parse_float=_finite_float
)
_CHECKING_INTEGERS = json.JSONDecoder(
    object_pairs_hook=_unique_keys,
    parse_constant=_no_constant,
    parse_float=_finite_float,
    parse_int=_exact_integer,
)


@functools.cache
def _integer_paths(model: type[BaseModel]) -> tuple[tuple[str, ...], ...]:
    """Where ``model`` expects an integer and no other number or boolean, from its JSON schema.

    Paths are keys, and :data:`_ITEM` for every item of an array; computed once per model.
    """
    schema = model.model_json_schema()
    definitions: Mapping[str, Any] = schema.get("$defs", {})
    found: dict[tuple[str, ...], None] = {}

    def visit(node: Mapping[str, Any], path: tuple[str, ...], expanding: frozenset[str]) -> None:
        alternatives = list(_alternatives(node, definitions, expanding))
        types: set[object] = set()
        for alternative, _ in alternatives:
            kind = alternative.get("type")
            types.update(kind if isinstance(kind, list) else [kind])
        if "integer" in types and not types & {"number", "boolean"}:
            found[path] = None
        for alternative, expanded in alternatives:
            for key, sub in alternative.get("properties", {}).items():
                visit(sub, (*path, key), expanded)
            items = alternative.get("items")
            if isinstance(items, Mapping):
                visit(items, (*path, _ITEM), expanded)

    visit(schema, (), frozenset())
    return tuple(found)


def _alternatives(
    node: Mapping[str, Any], definitions: Mapping[str, Any], expanding: frozenset[str]
) -> Iterator[tuple[Mapping[str, Any], frozenset[str]]]:
    """The schemas a value at ``node`` may match, through references and unions."""
    reference = node.get("$ref")
    if isinstance(reference, str):
        name = reference.rsplit("/", 1)[-1]
        if name not in expanding:  # a model inside itself is not followed again
            yield from _alternatives(definitions[name], definitions, expanding | {name})
        return
    union = node.get("anyOf") or node.get("oneOf")
    if union is None and len(node.get("allOf", ())) == 1:
        union = node["allOf"]
    if union is None:
        yield node, expanding
        return
    for branch in union:
        yield from _alternatives(branch, definitions, expanding)


def _values_at(document: object, path: tuple[str, ...]) -> list[object]:
    values = [document]
    for step in path:
        if step == _ITEM:
            values = [item for value in values if isinstance(value, list) for item in value]
        else:
            values = [value[step] for value in values if isinstance(value, dict) and step in value]
    return values
