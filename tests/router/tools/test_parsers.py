"""Each tool-call and reasoning parser on fixed model outputs, whole and streamed split
at every position (two chunks) and one character at a time: the stream's deltas add up
to the whole answer."""

from __future__ import annotations

import json

import pytest

from router.openai.chat_message import MessageParser, MessageStream, whole_message
from router.text.reasoning import get_reasoning_parser
from router.tools.parsers import NamedCallParser, RequiredCallsParser, get_tool_parser

WEATHER = {"city": "Paris", "unit": "celsius"}
HERMES = (
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
    '"unit": "celsius"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": '
    "{}}\n</tool_call>"
)
# (parser, output, content, [(name, arguments)])
CASES = [
    ("hermes", HERMES, "Let me check.\n", [("get_weather", WEATHER), ("get_time", {})]),
    ("hermes", "No tools needed <tool but text.", "No tools needed <tool but text.", []),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"x": 1}}', None, [("f", {"x": 1})]),
    ("hermes", "<tool_call>\n{not json}\n</tool_call>", "", []),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
     None, [("get_weather", WEATHER)]),
    ("llama3_json", '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"k": [1]}}',
     None, [("a", {}), ("b", {"k": [1]})]),
    ("llama3_json", "Just an answer {with braces}.", "Just an answer {with braces}.", []),
    ("mistral", 'Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]',
     "Sure. ", [("get_weather", WEATHER)]),
    ("mistral", "Nothing [TOOL here", "Nothing [TOOL here", []),
]  # fmt: skip


def streamed(parser: MessageParser, chunks: list[str]) -> tuple[str | None, str, list]:
    stream = MessageStream(parser)
    deltas = [d for chunk in chunks for d in stream.feed(chunk)] + stream.finish()
    reasoning, content, calls = None, "", {}
    for delta in deltas:
        if "reasoning_content" in delta:
            reasoning = (reasoning or "") + delta["reasoning_content"]
        content += delta.get("content", "")
        for call in delta.get("tool_calls", []):
            if "id" in call:
                assert call["index"] == len(calls) and call["function"]["arguments"] == ""
                calls[call["index"]] = [call["function"]["name"], ""]
            else:
                calls[call["index"]][1] += call["function"]["arguments"]
    return reasoning, content, [(n, json.loads(a)) for n, a in calls.values()]


def splits(text: str):
    yield [text]
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]
    yield list(text)


@pytest.mark.parametrize("name, output, content, calls", CASES)
def test_tool_parser_whole_and_streamed(name, output, content, calls):
    parser = MessageParser(tools=get_tool_parser(name))
    message = whole_message(parser, output)
    assert message["content"] == content
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
           for c in message.get("tool_calls", [])]  # fmt: skip
    assert got == calls
    for chunks in splits(output):
        assert streamed(parser, chunks) == (None, content or "", calls), chunks


def test_required_and_named_modes_stream_arguments():
    required = MessageParser(tools=RequiredCallsParser())
    output = '[{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}, {"name": "get_time", "parameters": {}}]'
    for chunks in splits(output):
        assert streamed(required, chunks)[2] == [("get_weather", WEATHER), ("get_time", {})]
    named = MessageParser(tools=NamedCallParser("get_weather"))
    arguments = json.dumps(WEATHER)
    stream = MessageStream(named)
    first = stream.feed(arguments[:5])
    assert first[0]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert first[1]["tool_calls"][0]["function"] == {"arguments": arguments[:5]}
    for chunks in splits(arguments):
        assert streamed(named, chunks)[2] == [("get_weather", WEATHER)]


# (parser, output, reasoning, content)
REASONING = [
    ("qwen3", "<think>\nThe user wants x.\n</think>\n\nHere is x.", "\nThe user wants x.\n", "Here is x."),
    ("qwen3", "Here is x, no thinking.", None, "Here is x, no thinking."),
    ("qwen3", "<think>cut off mid-thou", "cut off mid-thou", ""),
    ("deepseek_r1", "I should answer.</think>\n\nAnswer.", "I should answer.", "Answer."),
    ("deepseek_r1", "<think>I should answer.</think>Answer.", "I should answer.", "Answer."),
]  # fmt: skip


@pytest.mark.parametrize("name, output, reasoning, content", REASONING)
def test_reasoning_parser_whole_and_streamed(name, output, reasoning, content):
    parser = MessageParser(reasoning=get_reasoning_parser(name))
    message = whole_message(parser, output)
    assert (message["reasoning_content"], message["content"]) == (reasoning, content)
    for chunks in splits(output):
        assert streamed(parser, chunks)[:2] == (reasoning, content), chunks


def test_reasoning_then_a_tool_call():
    parser = MessageParser(get_reasoning_parser("qwen3"), get_tool_parser("hermes"))
    output = '<think>Need the weather.</think>\n\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    message = whole_message(parser, output)
    assert message["reasoning_content"] == "Need the weather."
    assert message["content"] is None
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_time"]
    for chunks in splits(output):
        assert streamed(parser, chunks) == ("Need the weather.", "", [("get_time", {})])


def test_hermes_streams_arguments_as_written_before_the_block_closes():
    stream = MessageStream(MessageParser(tools=get_tool_parser("hermes")))
    head = stream.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa')
    assert head[0]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert head[1]["tool_calls"][0]["function"] == {"arguments": '{"city": "Pa'}
    # The "}" might close the outer object: held until the block closes.
    assert stream.feed('ris"}') == [
        {"tool_calls": [{"index": 0, "function": {"arguments": 'ris"'}}]}
    ]
    tail = stream.feed("}\n</tool_call>") + stream.finish()
    assert tail == [{"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}]
