"""SSE framing: an event is one line, whatever the model wrote."""

from __future__ import annotations

import json

import httpx

from router.openai.responses import sse


def test_an_event_stays_one_line_for_every_line_splitter():
    text = "a\u2028b\x85c\u2029d\ne\rf"
    event = sse({"choices": [{"text": text}]})
    # httpx's aiter_lines splits on what str.splitlines does (U+2028, U+0085, ...):
    # the soak found events cut in two by such a character in generated text.
    lines = httpx._decoders.LineDecoder().decode(event.decode())
    assert lines == [lines[0], ""] and lines[0].startswith("data: ")
    assert json.loads(lines[0].removeprefix("data: "))["choices"][0]["text"] == text
    assert event.decode().splitlines() == [lines[0], ""]
