"""A constraint on a request's output: JSON schema, any JSON object, regex, choice
or grammar (vLLM's `StructuredOutputsParams`).

The router builds it from the API's fields (response_format, structured_outputs,
guided_*, tool_choice); the worker compiles it into a grammar
(worker/structured/). It is hashable, so a compiled grammar is cached under it.
Only the form is checked here; whether the schema, regex or grammar compiles is
the worker's check, which names the problem.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from shared.errors import InvalidRequestError

FIELD = "structured_outputs"
MAX_CONSTRAINT_CHARS = 65536
MAX_CHOICES = 1024


@dataclass(frozen=True)
class StructuredOutputsParams:
    """Exactly one of the fields is set. `json` is a JSON schema as JSON text."""

    json: str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        if self.choice is not None:
            object.__setattr__(self, "choice", tuple(self.choice))
        kinds = [k for k in ("json", "regex", "choice", "grammar") if getattr(self, k) is not None]
        if self.json_object:
            kinds.append("json_object")
        if len(kinds) != 1:
            raise InvalidRequestError(
                FIELD,
                "set exactly one of json, json_object, regex, choice, grammar; "
                f"got {', '.join(kinds) or 'none'}",
            )
        for name in ("json", "regex", "grammar"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, str) or not value.strip():
                raise InvalidRequestError(f"{FIELD}.{name}", "must be a non-empty string")
            if len(value) > MAX_CONSTRAINT_CHARS:
                raise InvalidRequestError(
                    f"{FIELD}.{name}",
                    f"must have at most {MAX_CONSTRAINT_CHARS} characters, got {len(value)}",
                )
        if self.json is not None:
            try:
                schema = json.loads(self.json)
            except ValueError as exc:
                raise InvalidRequestError(f"{FIELD}.json", f"is not valid JSON: {exc}") from None
            if not isinstance(schema, (dict, bool)):
                raise InvalidRequestError(
                    f"{FIELD}.json", f"a JSON schema is an object or a boolean, got {schema!r}"
                )
        if self.choice is not None:
            if not 1 <= len(self.choice) <= MAX_CHOICES:
                raise InvalidRequestError(
                    f"{FIELD}.choice",
                    f"must list 1 to {MAX_CHOICES} strings, got {len(self.choice)}",
                )
            if any(not isinstance(c, str) or not c for c in self.choice):
                raise InvalidRequestError(
                    f"{FIELD}.choice", "each choice must be a non-empty string"
                )

    @property
    def kind(self) -> str:
        if self.json_object:
            return "json_object"
        return next(
            k for k in ("json", "regex", "choice", "grammar") if getattr(self, k) is not None
        )

    @classmethod
    def from_schema(cls, schema: dict | bool) -> StructuredOutputsParams:
        """A JSON-schema constraint from a parsed schema (keys sorted, so equal schemas
        share one compiled grammar)."""
        return cls(json=json.dumps(schema, sort_keys=True, separators=(",", ":")))
