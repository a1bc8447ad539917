"""The API's ways to constrain an answer, as the one `structured_outputs` constraint.

OpenAI's `response_format` ({"type": "json_object"} or {"type": "json_schema",
"json_schema": {"name", "schema", "strict"}}), vLLM's `structured_outputs`
({"json" | "regex" | "choice" | "grammar" | "json_object"}) and its older
`guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` all become one
`StructuredOutputsParams`; a request may use only one of them. Whether the
schema, regex or grammar compiles is the worker's check (a 400 naming it).
"""

from __future__ import annotations

import json
from typing import Any

from router.openai.protocol import SamplingFields
from shared.errors import InvalidRequestError
from shared.structured_outputs import StructuredOutputsParams

_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
_STRUCTURED_KEYS = ("json", "regex", "choice", "grammar", "json_object")
# vLLM options that change nothing for xgrammar with compact JSON, accepted as given.
_STRUCTURED_IGNORED = (
    "disable_any_whitespace",
    "disable_fallback",
    "disable_additional_properties",
)


def _schema_text(field: str, value: Any) -> str:
    """A schema given as an object or as JSON text, as canonical JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise InvalidRequestError(field, f"is not valid JSON: {exc}") from None
    if not isinstance(value, (dict, bool)):
        raise InvalidRequestError(field, f"must be a JSON schema (an object), got {value!r}")
    return StructuredOutputsParams.from_schema(value).json


def _from_response_format(value: dict[str, Any]) -> StructuredOutputsParams | None:
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise InvalidRequestError(
                "response_format.json_schema",
                'must be an object with a "schema" (and a "name")',
            )
        # strict or not, the schema is enforced: the grammar admits nothing else.
        return StructuredOutputsParams(
            json=_schema_text("response_format.json_schema.schema", spec["schema"])
        )
    raise InvalidRequestError(
        "response_format.type", f"must be text, json_object or json_schema, got {kind!r}"
    )


def _from_structured(value: Any) -> StructuredOutputsParams:
    if not isinstance(value, dict):
        raise InvalidRequestError("structured_outputs", f"must be an object, got {value!r}")
    unknown = [
        k for k in value if k not in _STRUCTURED_KEYS + _STRUCTURED_IGNORED and value[k] is not None
    ]
    if unknown:
        raise InvalidRequestError(
            f"structured_outputs.{unknown[0]}",
            f"is not supported (supported: {', '.join(_STRUCTURED_KEYS)})",
        )
    set_keys = {k: value[k] for k in _STRUCTURED_KEYS if value.get(k) not in (None, False)}
    if "json" in set_keys:
        set_keys["json"] = _schema_text("structured_outputs.json", set_keys["json"])
    return StructuredOutputsParams(**set_keys)


def _from_guided(name: str, value: Any) -> StructuredOutputsParams:
    if name == "guided_json":
        return StructuredOutputsParams(json=_schema_text(name, value))
    if name == "guided_choice":
        if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
            raise InvalidRequestError(name, "must be a list of strings")
        return StructuredOutputsParams(choice=tuple(value))
    if not isinstance(value, str):
        raise InvalidRequestError(name, "must be a string")
    return StructuredOutputsParams(**{name.removeprefix("guided_"): value})


def structured_outputs(request: SamplingFields) -> StructuredOutputsParams | None:
    """The request's constraint, or None. 400 when more than one field sets one."""
    found: list[tuple[str, StructuredOutputsParams]] = []
    response_format = getattr(request, "response_format", None)
    if response_format is not None:
        constraint = _from_response_format(response_format)
        if constraint is not None:
            found.append(("response_format", constraint))
    if request.structured_outputs is not None:
        found.append(("structured_outputs", _from_structured(request.structured_outputs)))
    for name in _GUIDED:
        value = getattr(request, name)
        if value is not None:
            found.append((name, _from_guided(name, value)))
    if len(found) > 1:
        raise InvalidRequestError(
            found[1][0], f"constrains the output, and so does {found[0][0]}: set only one"
        )
    return found[0][1] if found else None
