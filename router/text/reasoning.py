"""Reasoning parsers (vLLM's --reasoning-parser): split `<think>…</think>` off an answer.

`parse(text, final)` -> (reasoning, content) of the output so far; before the
end it holds back a partial marker, so successive results only grow.

* qwen3: reasoning only when the answer opens with `<think>` (with
  enable_thinking false the template closes the block in the prompt, and the
  answer is all content).
* deepseek_r1: the template opens the block in the prompt, so the answer is
  reasoning until `</think>` (a leading `<think>` is dropped).

Either way, an answer cut off before `</think>` is all reasoning.
"""

from __future__ import annotations

from router.tools.parsers import partial_marker_len
from shared.errors import ConfigError

START, END = "<think>", "</think>"


class ReasoningParser:
    name = "deepseek_r1"
    needs_start = False  # reasoning only after an explicit <think>

    def parse(self, text: str, final: bool) -> tuple[str | None, str]:
        body = text.lstrip()
        if body.startswith(START):
            body = body[len(START) :]
        elif not final and START.startswith(body):
            return None, ""  # too early to say
        elif self.needs_start:
            return None, text
        end = body.find(END)
        if end < 0:
            hold = 0 if final else partial_marker_len(body, END)
            return body[: len(body) - hold], ""
        # The newlines a template puts after </think> belong to neither part.
        return body[:end], body[end + len(END) :].lstrip("\n")


class Qwen3ReasoningParser(ReasoningParser):
    name = "qwen3"
    needs_start = True


REASONING_PARSERS = {p.name: p for p in (ReasoningParser, Qwen3ReasoningParser)}


def get_reasoning_parser(name: str) -> ReasoningParser:
    if name not in REASONING_PARSERS:
        raise ConfigError(
            f"--reasoning-parser must be one of {', '.join(REASONING_PARSERS)}, got {name!r}"
        )
    return REASONING_PARSERS[name]()
