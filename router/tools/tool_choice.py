"""`tools` and `tool_choice` of a chat request, checked, and what they demand.

```
tool_choice  none      the answer is text (tools still reach the template)
             auto      the model decides; its own syntax is parsed (--tool-call-parser)
             required  a grammar: a JSON array of {"name", "parameters"} calls, at least
                       one (exactly one when parallel_tool_calls is false)
             named     a grammar: the named function's arguments, a JSON object
```
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from shared.errors import InvalidRequestError
from shared.structured_outputs import StructuredOutputsParams

CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class Function:
    name: str
    parameters: dict[str, Any]  # a JSON schema of the arguments object

    def as_tool(self, description: str | None) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if description is not None:
            function["description"] = description
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolChoice:
    """mode: none | auto | required | named (then `named` is the function's name)."""

    mode: str
    functions: tuple[Function, ...]
    template_tools: list[dict[str, Any]] | None  # as the chat template gets them
    named: str | None = None
    parallel: bool = True

    def constraint(self) -> StructuredOutputsParams | None:
        if self.mode == "named":
            function = next(f for f in self.functions if f.name == self.named)
            return StructuredOutputsParams.from_schema(function.parameters)
        if self.mode == "required":
            return StructuredOutputsParams.from_schema(self.required_schema())
        return None

    def required_schema(self) -> dict[str, Any]:
        calls = [
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [f.name]},
                    "parameters": f.parameters,
                },
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
            for f in self.functions
        ]
        schema: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
        if not self.parallel:
            schema["maxItems"] = 1
        return schema


def _function(i: int, tool: Any) -> tuple[Function, str | None]:
    where = f"tools.{i}"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise InvalidRequestError(f"{where}.type", 'must be "function"')
    spec = tool.get("function")
    if not isinstance(spec, dict):
        raise InvalidRequestError(f"{where}.function", "must be an object with a name")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequestError(f"{where}.function.name", "must be a non-empty string")
    parameters = spec.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
        raise InvalidRequestError(f"{where}.function.parameters", "must be a JSON schema object")
    description = spec.get("description")
    return Function(name, parameters), description if isinstance(description, str) else None


def tool_choice(
    tools: list[Any] | None,
    choice: Any,
    parallel_tool_calls: bool | None,
    auto_enabled: bool,
) -> ToolChoice:
    """The request's tool choice, or a 400 naming what is wrong."""
    pairs = [_function(i, t) for i, t in enumerate(tools or [])]
    functions = tuple(f for f, _ in pairs)
    names = [f.name for f in functions]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise InvalidRequestError("tools", f"two functions are named {duplicate!r}")
    template_tools = [f.as_tool(d) for f, d in pairs] or None
    parallel = parallel_tool_calls is not False
    if choice is None:
        # OpenAI: "none" without tools, "auto" with them; auto needs a parser here.
        choice = "auto" if functions and auto_enabled else "none"
    if isinstance(choice, dict):
        spec = choice.get("function") if choice.get("type") == "function" else None
        name = spec.get("name") if isinstance(spec, dict) else None
        if not isinstance(name, str):
            raise InvalidRequestError(
                "tool_choice", 'a named choice is {"type": "function", "function": {"name": ...}}'
            )
        if name not in names:
            raise InvalidRequestError(
                "tool_choice.function.name", f"{name!r} is not among the request's tools"
            )
        return ToolChoice("named", functions, template_tools, name, parallel)
    if choice not in CHOICES:
        raise InvalidRequestError(
            "tool_choice", f"must be none, auto, required or a named function, got {choice!r}"
        )
    if choice != "none" and not functions:
        raise InvalidRequestError("tool_choice", f"is {choice!r}, but the request has no tools")
    if choice == "auto" and not auto_enabled:
        raise InvalidRequestError(
            "tool_choice",
            '"auto" needs the router started with --enable-auto-tool-choice and a '
            "--tool-call-parser",
        )
    return ToolChoice(choice, functions, template_tools, None, parallel)


def template_tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's tool_calls as chat templates read them: arguments as an
    object (HF's convention), not the API's JSON text."""
    if not isinstance(calls, list):
        raise InvalidRequestError(where, "must be a list of tool calls")
    result = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequestError(f"{where}.{i}.function", "must have a name and arguments")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError as exc:
                raise InvalidRequestError(
                    f"{where}.{i}.function.arguments", f"is not valid JSON: {exc}"
                ) from None
        entry = {"name": function["name"], "arguments": arguments}
        result.append({"id": call.get("id"), "type": "function", "function": entry})
    return result
