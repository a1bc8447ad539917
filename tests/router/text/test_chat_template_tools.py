"""Tools, earlier tool calls, tool results and template kwargs render exactly as
transformers' apply_chat_template renders them."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from router.text.chat_template import ChatTemplate
from router.tools.tool_choice import template_tool_calls
from tests.router.tools.conversation import HISTORY, TEMPLATE, TOOLS


def template_history() -> list[dict]:
    """HISTORY as the router hands it to templates (arguments as objects)."""
    messages = []
    for message in HISTORY:
        entry = {**message, "content": message["content"] or ""}
        if "tool_calls" in message:
            entry["tool_calls"] = template_tool_calls(message["tool_calls"], "tool_calls")
        messages.append(entry)
    return messages


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}])
def test_tools_render_as_in_transformers(make_checkpoint, kwargs):
    tokenizer = AutoTokenizer.from_pretrained(make_checkpoint("llama"))
    source = TEMPLATE.read_text()
    messages = template_history()
    expected = tokenizer.apply_chat_template(
        messages, tools=TOOLS, chat_template=source, tokenize=False,
        add_generation_prompt=True, **kwargs,
    )  # fmt: skip
    got = ChatTemplate(source, {}).render(messages, True, TOOLS, kwargs)
    assert got == expected
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}' in got
    assert json.dumps(TOOLS[1], ensure_ascii=False) in got
    assert got.endswith("<think>\n\n</think>\n\n") == bool(kwargs)
