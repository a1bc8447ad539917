"""Constraints the structured-output tests share: small enough that a random-weight
model finishes them well within max_tokens (bounded strings and numbers).

NOTE: strings are bounded by a pattern, not maxLength: xgrammar 0.2.9 compiles a
maxLength string to `[^"\\\r\n]{0,n}`, which admits control characters (a raw tab)
that strict JSON parsers refuse."""

from __future__ import annotations

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z ]{1,6}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "admin": {"type": "boolean"},
        "team": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "age", "admin", "team"],
    "additionalProperties": False,
}
POINTS = {
    "type": "object",
    "properties": {
        "points": {
            "type": "array",
            "items": {"type": "integer", "minimum": -9, "maximum": 9},
            "minItems": 1,
            "maxItems": 3,
        }
    },
    "required": ["points"],
    "additionalProperties": False,
}
REGEX = r"[A-Z]{2}-\d{3}(x|yz)?"
CHOICES = ("yes", "no", 'maybe "so"', "café")
GRAMMAR = 'root ::= "(" expr ")"\nexpr ::= [0-9] | [0-9] "+" expr'
