"""One chat choice's output text as an assistant message: reasoning, content, tool calls.

The whole answer is parsed once (`whole_message`); a stream re-parses the text
so far at every delta and sends what grew (`MessageStream`), so the two agree
however the text was split into chunks:

```
text so far ── reasoning parser ──► reasoning_content │ rest
                                          rest ── tool parser ──► content │ calls
deltas: {"reasoning_content"}, {"content"}, {"tool_calls": [{index, id, type, function:
        {name, arguments: ""}}]} once per call, then {"tool_calls": [{index, function:
        {arguments: fragment}}]} as its arguments grow (as OpenAI streams them)
```
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from router.text.reasoning import ReasoningParser
from router.tools.parsers import ParsedCall, ToolParser


def tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class MessageParser:
    reasoning: ReasoningParser | None = None
    tools: ToolParser | None = None
    max_calls: int | None = None  # 1 under parallel_tool_calls false

    @property
    def is_plain(self) -> bool:
        return self.reasoning is None and self.tools is None

    def parse(self, text: str, final: bool) -> tuple[str | None, str, list[ParsedCall]]:
        reasoning, rest = (
            (None, text) if self.reasoning is None else self.reasoning.parse(text, final)
        )
        if self.tools is None:
            return reasoning, rest, []
        parsed = self.tools.parse(rest, final)
        return reasoning, parsed.content, parsed.calls[: self.max_calls]


def _call_dict(call: ParsedCall, call_id: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def whole_message(parser: MessageParser, text: str) -> dict[str, Any]:
    """The message fields of a whole answer (role aside)."""
    reasoning, content, calls = parser.parse(text, final=True)
    message: dict[str, Any] = {"content": content if content.strip() or not calls else None}
    if parser.reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [_call_dict(c, tool_call_id()) for c in calls]
    return message


def finish_reason(reason: str | None, has_calls: bool) -> str | None:
    return "tool_calls" if has_calls and reason == "stop" else reason


class MessageStream:
    """The deltas of one streamed choice."""

    def __init__(self, parser: MessageParser) -> None:
        self._parser = parser
        self._text = ""
        self._sent_reasoning = 0
        self._sent_content = 0
        self._sent_calls: list[tuple[str, int]] = []  # (id, arguments characters sent)

    @property
    def has_calls(self) -> bool:
        return bool(self._sent_calls)

    def feed(self, text: str) -> list[dict[str, Any]]:
        self._text += text
        return self._deltas(final=False)

    def finish(self) -> list[dict[str, Any]]:
        return self._deltas(final=True)

    def _deltas(self, final: bool) -> list[dict[str, Any]]:
        reasoning, content, calls = self._parser.parse(self._text, final)
        deltas: list[dict[str, Any]] = []
        if reasoning is not None and len(reasoning) > self._sent_reasoning:
            deltas.append({"reasoning_content": reasoning[self._sent_reasoning :]})
            self._sent_reasoning = len(reasoning)
        # Whitespace before a tool call is no content: hold it until text follows.
        if len(content) > self._sent_content and (content.strip() or (final and not calls)):
            deltas.append({"content": content[self._sent_content :]})
            self._sent_content = len(content)
        for index, call in enumerate(calls):
            if index == len(self._sent_calls):
                self._sent_calls.append((tool_call_id(), 0))
                call_id = self._sent_calls[index][0]
                head = {"index": index, "id": call_id, "type": "function"}
                deltas.append(
                    {"tool_calls": [{**head, "function": {"name": call.name, "arguments": ""}}]}
                )
            call_id, sent = self._sent_calls[index]
            if len(call.arguments) > sent:
                fragment = call.arguments[sent:]
                deltas.append(
                    {"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}
                )
                self._sent_calls[index] = (call_id, len(call.arguments))
        return deltas
