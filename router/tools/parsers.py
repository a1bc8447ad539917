"""Parsers of the tool calls in a model's output, one per model family (vLLM's
--tool-call-parser names), plus the two tool_choice modes whose output is a grammar's.

`parse(text, final)` reads the output so far. Before the end (`final` false) it
returns only what can no longer change: content up to where a tool call could
be starting (a partial marker is held back) and the calls already closed; so
successive results only ever grow, which is what streaming diffs them on.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from shared.errors import ConfigError

_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of the arguments object


@dataclass
class ParsedOutput:
    content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)


def partial_marker_len(text: str, marker: str) -> int:
    """Length of the longest end of `text` that starts `marker` (and is not all of it)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def call_from_object(obj: Any, arguments_key: str = "arguments") -> ParsedCall | None:
    """{"name": ..., "arguments" (or "parameters"): {...}} as a call; None if it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get(arguments_key, obj.get("parameters", obj.get("arguments", {})))
    return ParsedCall(obj["name"], arguments_text(arguments))


def decode_objects(text: str, separators: str) -> tuple[list[Any], int]:
    """JSON values one after another (separated by any of `separators` or whitespace);
    the values and where the first undecodable rest starts."""
    values, pos = [], 0
    while True:
        while pos < len(text) and (text[pos].isspace() or text[pos] in separators):
            pos += 1
        if pos >= len(text):
            return values, pos
        try:
            value, end = _DECODER.raw_decode(text, pos)
        except ValueError:
            return values, pos
        values.append(value)
        pos = end


class ToolParser(ABC):
    name: ClassVar[str]
    # The markers are special tokens the router must not skip when detokenizing.
    needs_special_tokens: ClassVar[bool] = False

    @abstractmethod
    def parse(self, text: str, final: bool) -> ParsedOutput: ...


class HermesToolParser(ToolParser):
    """Qwen2.5 / Qwen3 / Hermes: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
    one block per call; content is the text before the first block.

    A call written name first (as the template asks) streams its arguments while they
    are written: they are the model's own text, up to the block's last "}" (held back
    until the block closes, since it may be the outer object's)."""

    name = "hermes"
    START, END = "<tool_call>", "</tool_call>"
    HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]+)"\s*,\s*"arguments"\s*:\s*')

    def parse(self, text: str, final: bool) -> ParsedOutput:
        first = text.find(self.START)
        if first < 0:
            hold = 0 if final else partial_marker_len(text, self.START)
            return ParsedOutput(text[: len(text) - hold])
        out = ParsedOutput(text[:first])
        pos = first
        while (start := text.find(self.START, pos)) >= 0:
            body_start = start + len(self.START)
            end = text.find(self.END, body_start)
            if end < 0:
                if final:  # cut short (max_tokens): keep what parses
                    self._add(out, text[body_start:])
                elif (head := self.HEAD.match(text, body_start)) is not None:
                    partial = text[head.end() :]
                    cut = partial.rfind("}")
                    arguments = partial if cut < 0 else partial[:cut]
                    out.calls.append(ParsedCall(head.group(1), arguments))
                break
            self._add(out, text[body_start:end])
            pos = end + len(self.END)
        return out

    @classmethod
    def _add(cls, out: ParsedOutput, body: str) -> None:
        try:
            obj = json.loads(body)
        except ValueError:
            return
        call = call_from_object(obj)
        if call is None:
            return
        head = cls.HEAD.match(body)
        if head is not None:  # the arguments as written (and as streamed)
            raw = body[head.end() : body.rstrip().rfind("}")].rstrip()
            try:
                if json.loads(raw) == obj.get("arguments"):
                    call = ParsedCall(call.name, raw)
            except ValueError:
                pass
        out.calls.append(call)


class Llama3JsonToolParser(ToolParser):
    """Llama 3.x: the answer is `{"name": ..., "parameters": {...}}` (several joined
    by "; "), after an optional <|python_tag|>; anything else is content."""

    name = "llama3_json"
    needs_special_tokens = True
    TAG = "<|python_tag|>"

    def parse(self, text: str, final: bool) -> ParsedOutput:
        body = text.lstrip()
        if body.startswith(self.TAG):
            body = body[len(self.TAG) :].lstrip()
        elif not final and (not body or self.TAG.startswith(body)):
            return ParsedOutput()  # too early to say
        if not body.startswith("{"):
            return ParsedOutput(text if final or body else "")
        values, _ = decode_objects(body, ";")
        calls = [c for c in (call_from_object(v, "parameters") for v in values) if c]
        if final and not calls:
            return ParsedOutput(text)
        return ParsedOutput("", calls)


class MistralToolParser(ToolParser):
    """Mistral: content, then `[TOOL_CALLS]` and a JSON array of {"name", "arguments"}."""

    name = "mistral"
    needs_special_tokens = True
    MARKER = "[TOOL_CALLS]"

    def parse(self, text: str, final: bool) -> ParsedOutput:
        at = text.find(self.MARKER)
        if at < 0:
            hold = 0 if final else partial_marker_len(text, self.MARKER)
            return ParsedOutput(text[: len(text) - hold])
        out = ParsedOutput(text[:at])
        values, _ = decode_objects(text[at + len(self.MARKER) :], ",")
        for value in values:
            for item in value if isinstance(value, list) else [value]:
                call = call_from_object(item)
                if call is not None:
                    out.calls.append(call)
        return out


class RequiredCallsParser(ToolParser):
    """tool_choice "required": the grammar's JSON array of {"name", "parameters"}; each
    call is complete when its object closes."""

    name = "required"

    def parse(self, text: str, final: bool) -> ParsedOutput:
        body = text.lstrip()
        if not body.startswith("["):
            return ParsedOutput()
        values, _ = decode_objects(body[1:], ",]")
        return ParsedOutput(
            "", [c for c in (call_from_object(v, "parameters") for v in values) if c]
        )


class NamedCallParser(ToolParser):
    """A named tool_choice: the whole output is the function's arguments, streamed as
    they come."""

    name = "named"

    def __init__(self, function_name: str) -> None:
        self.function_name = function_name

    def parse(self, text: str, final: bool) -> ParsedOutput:
        return ParsedOutput("", [ParsedCall(self.function_name, text)])


TOOL_PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesToolParser, Llama3JsonToolParser, MistralToolParser)
}


def get_tool_parser(name: str) -> ToolParser:
    if name not in TOOL_PARSERS:
        raise ConfigError(
            f"--tool-call-parser must be one of {', '.join(TOOL_PARSERS)}, got {name!r}"
        )
    return TOOL_PARSERS[name]()
