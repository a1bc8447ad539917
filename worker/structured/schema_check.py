"""JSON-schema keywords xgrammar compiles but does not enforce, refused up front.

xgrammar 0.2.9 accepts `not`, `if`/`then`/`else`, `allOf`, `dependentRequired`,
`dependentSchemas` and unknown `format`s, and then lets through outputs they
would reject (measured: `allOf` of integer and minimum 3 admits "1"). A grammar
that can emit what the schema forbids breaks the promise that every answer
validates, so such a schema is a 400 naming the keyword and where it is.
"""

from __future__ import annotations

import json
from typing import Any

from shared.errors import InvalidRequestError

UNENFORCED = ("not", "if", "then", "else", "allOf", "dependentRequired", "dependentSchemas")
FORMATS = (
    "email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid",
    "uri", "uri-reference", "uri-template", "json-pointer", "relative-json-pointer",
)  # fmt: skip
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SCHEMAS = ("items", "additionalProperties", "contains", "propertyNames", "unevaluatedProperties",
            "unevaluatedItems", "additionalItems")  # fmt: skip


def _check(schema: Any, where: str) -> None:
    if not isinstance(schema, dict):
        return
    for keyword in UNENFORCED:
        if keyword in schema:
            raise InvalidRequestError(
                "structured_outputs.json",
                f"{where}: the keyword {keyword!r} is not supported (the grammar could not "
                "enforce it); express the schema without it",
            )
    fmt = schema.get("format")
    if fmt is not None and fmt not in FORMATS:
        raise InvalidRequestError(
            "structured_outputs.json",
            f"{where}: format {fmt!r} is not supported (supported: {', '.join(FORMATS)})",
        )
    for key in _SCHEMA_MAPS:
        for name, sub in (schema.get(key) or {}).items():
            _check(sub, f"{where}/{key}/{name}")
    for key in _SCHEMA_LISTS:
        for i, sub in enumerate(schema.get(key) or []):
            _check(sub, f"{where}/{key}/{i}")
    for key in _SCHEMAS:
        sub = schema.get(key)
        if isinstance(sub, list):  # draft-4 tuple items
            for i, item in enumerate(sub):
                _check(item, f"{where}/{key}/{i}")
        else:
            _check(sub, f"{where}/{key}")


def check_enforceable(schema_text: str) -> None:
    """Raise the InvalidRequestError naming the first keyword the grammar would ignore."""
    _check(json.loads(schema_text), "#")
