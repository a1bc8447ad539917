"""Tool calling and reasoning through the official openai client against a `pagoda
serve` of its own: the Hermes template, --enable-auto-tool-choice
--tool-call-parser hermes --reasoning-parser qwen3. The model has random weights, so
"auto" is driven by a regex that makes it write a Hermes call, and reasoning by one
that makes it think first; required and named choices need nothing but their grammar."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

from tests.cluster import ENGINE_FLAGS
from tests.router.conftest import MODEL, serving
from tests.router.tools.conversation import HISTORY, SCHEMAS, TEMPLATE, TOOLS

USER = [{"role": "user", "content": "Weather in Rome for three days?"}]
HERMES_CALL = (
    r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|Rome)", "days": [1-7]\}\}'
    r"\n</tool_call>"
)
THINKING = r"<think>[a-z]{1,8}( [a-z]{1,8}){0,3}</think>\n\n[A-Z][a-z]{1,6}\."


@pytest.fixture(scope="module")
def tooled(make_checkpoint, tmp_path_factory):
    args = [str(make_checkpoint("llama")), f"--served-model-name={MODEL}", *ENGINE_FLAGS]
    args += [f"--chat-template={TEMPLATE}", "--enable-auto-tool-choice"]
    args += ["--tool-call-parser=hermes", "--reasoning-parser=qwen3"]
    # The tools' system prompt alone is ~800 tokens of the tiny tokenizer.
    args += ["--max-model-len=1024", "--max-num-batched-tokens=1024", "--num-kv-blocks=1024"]
    with serving(args, tmp_path_factory.mktemp("tools") / "serve.log", 1) as served:
        yield served


def check_calls(message, expected_names=None) -> list[str]:
    names = []
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        names.append(call.function.name)
    assert names and (expected_names is None or names == expected_names)
    return names


def test_template_renders_tools_history_and_kwargs(tooled, make_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(make_checkpoint("llama"))
    client = tooled.client()
    history = [dict(m, content=m["content"] or "") for m in HISTORY]
    for message in history:
        for call in message.get("tool_calls", []):
            call["function"] = dict(
                call["function"], arguments=json.loads(call["function"]["arguments"])
            )
    for kwargs in ({}, {"enable_thinking": False}):
        out = client.chat.completions.create(
            model=MODEL, messages=HISTORY, tools=TOOLS, tool_choice="none", max_tokens=1,
            extra_body={"chat_template_kwargs": kwargs},
        )  # fmt: skip
        text = tokenizer.apply_chat_template(
            history, tools=TOOLS, chat_template=TEMPLATE.read_text(), add_generation_prompt=True,
            tokenize=False, **kwargs,
        )  # fmt: skip
        assert out.usage.prompt_tokens == len(tokenizer.encode(text, add_special_tokens=False))
        assert out.choices[0].message.tool_calls is None


@pytest.mark.parametrize("parallel", [False, True])
def test_required_calls_always_validate(tooled, parallel):
    out = tooled.client().chat.completions.create(
        model=MODEL, messages=USER, tools=TOOLS, tool_choice="required", n=4, seed=3,
        temperature=1.0, max_tokens=200, parallel_tool_calls=parallel,
    )  # fmt: skip
    for choice in out.choices:
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        names = check_calls(choice.message)
        if not parallel:
            assert len(names) == 1


def test_named_choice_streams_with_the_openai_helper(tooled):
    client = tooled.client()
    named = {"type": "function", "function": {"name": "get_time"}}
    params = dict(model=MODEL, messages=USER, tools=TOOLS, tool_choice=named, seed=9,
                  temperature=1.0, max_tokens=60)  # fmt: skip
    whole = client.chat.completions.create(**params)
    assert whole.choices[0].finish_reason == "tool_calls"
    check_calls(whole.choices[0].message, ["get_time"])
    with client.chat.completions.stream(**params) as stream:
        final = stream.get_final_completion()
    check_calls(final.choices[0].message, ["get_time"])
    streamed = final.choices[0].message.tool_calls[0].function.arguments
    assert streamed == whole.choices[0].message.tool_calls[0].function.arguments


def test_auto_parses_a_hermes_call_whole_and_streamed(tooled):
    client = tooled.client()
    params = dict(model=MODEL, messages=USER, tools=TOOLS, tool_choice="auto", seed=4,
                  temperature=1.0, max_tokens=200, extra_body={"guided_regex": HERMES_CALL})  # fmt: skip
    whole = client.chat.completions.create(**params)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    check_calls(choice.message, ["get_weather"])
    chunks = list(client.chat.completions.create(**params, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    head, *fragments = [d.tool_calls[0] for d in deltas]
    assert (head.index, head.type, head.function.name, head.function.arguments) == (
        0, "function", "get_weather", "",
    )  # fmt: skip
    assert head.id.startswith("call_") and all(f.id is None for f in fragments)
    arguments = "".join(f.function.arguments for f in fragments)
    assert arguments == choice.message.tool_calls[0].function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert all(not (c.choices and c.choices[0].delta.content) for c in chunks)


def test_reasoning_content_whole_and_streamed(tooled):
    client = tooled.client()
    params = dict(model=MODEL, messages=USER, seed=6, temperature=1.0, max_tokens=60,
                  extra_body={"guided_regex": THINKING})  # fmt: skip
    message = client.chat.completions.create(**params).choices[0].message
    assert message.reasoning_content and " " not in message.content
    assert message.content.endswith(".") and "<think>" not in message.content
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(**params, stream=True):
        if chunk.choices:
            reasoning += getattr(chunk.choices[0].delta, "reasoning_content", None) or ""
            content += chunk.choices[0].delta.content or ""
    assert (reasoning, content) == (message.reasoning_content, message.content)


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice.function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
         "tool_choice"),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
    ],
)  # fmt: skip
def test_bad_tool_requests_are_400(tooled, extra, field):
    with pytest.raises(openai.BadRequestError) as info:
        tooled.client().chat.completions.create(
            model=MODEL, messages=USER, max_tokens=2, extra_body=extra
        )
    assert info.value.body["message"].startswith(f"{field}: "), info.value.body
