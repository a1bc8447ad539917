"""Tools and a conversation with an earlier tool call and its result, shared by the
template and end-to-end tests. Argument schemas are bounded, so a random-weight model
constrained by them finishes well within max_tokens."""

from __future__ import annotations

from pathlib import Path

TEMPLATE = Path(__file__).with_name("hermes_template.jinja")
WEATHER_ARGS = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME_ARGS = {
    "type": "object",
    "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Forecast.",
                                      "parameters": WEATHER_ARGS}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME_ARGS}},
]  # fmt: skip
SCHEMAS = {"get_weather": WEATHER_ARGS, "get_time": TIME_ARGS}
HISTORY = [
    {"role": "system", "content": "You help travellers."},
    {"role": "user", "content": "Weather in Oslo?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 2}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"forecast": "snow"}'},
    {"role": "user", "content": "And the time there?"},
]
