"""The official openai client against `pagoda serve` with two workers: only base_url changes."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

from bench.checkpoints import EOS_TOKEN_ID
from tests.conftest import wait_for
from tests.router.conftest import MODEL

PROMPT = "Café, naïve: 中文字符 🚀 and"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 🚀 中文?"}]


def expected_greedy(hf_greedy, make_checkpoint, tokenizer, prompt_ids, max_tokens):
    """What the model itself generates greedily, cut at EOS as the engine stops."""
    ids = hf_greedy(make_checkpoint("llama"), [prompt_ids], max_tokens)[0]
    if EOS_TOKEN_ID in ids:
        ids = ids[: ids.index(EOS_TOKEN_ID) + 1]
    return ids, tokenizer.decode(ids)


def test_models_lists_the_served_model(served):
    models = served.client().models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].max_model_len == 256


def test_greedy_completion_is_the_models_own_and_streams_identically(
    served, tokenizer, hf_greedy, make_checkpoint
):
    client = served.client()
    prompt_ids = tokenizer.encode(PROMPT)
    ids, text = expected_greedy(hf_greedy, make_checkpoint, tokenizer, prompt_ids, 24)
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
    choice = whole.choices[0]
    assert choice.text == text
    assert choice.finish_reason == ("stop" if ids[-1] == EOS_TOKEN_ID else "length")
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(prompt_ids), len(ids))
    assert whole.usage.total_tokens == len(prompt_ids) + len(ids)
    assert whole.usage.prompt_tokens_details.cached_tokens is not None

    stream = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ids)
    assert all(c.usage is None for c in chunks[:-1])


def test_greedy_chat_streams_identically_and_counts_exactly(served, tokenizer):
    client = served.client()
    whole = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=20, temperature=0
    )
    rendered = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi 🚀 中文?<|im_end|>\n"
    prompt_ids = tokenizer.encode(rendered + "<|im_start|>assistant\n", add_special_tokens=False)
    assert whole.usage.prompt_tokens == len(prompt_ids)
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=20, temperature=0, stream=True
        )
    )
    # Role chunk, content chunks, finish chunk, as OpenAI streams them.
    assert (
        chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    )
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content
    assert whole.choices[0].message.role == "assistant"


def test_n_gives_indexed_choices_and_usage_counts_all_of_them(served):
    client = served.client()
    kwargs = dict(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=11, logprobs=1)
    whole = client.completions.create(n=3, **kwargs)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert len({c.text for c in whole.choices}) > 1  # samples differ
    assert whole.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in whole.choices)
    streamed = {0: "", 1: "", 2: ""}
    for chunk in client.completions.create(n=3, stream=True, **kwargs):
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == {c.index: c.text for c in whole.choices}  # seeded: the same samples


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_cut_the_text_also_when_streamed(served, stream):
    client = served.client()
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
    text = full.choices[0].text
    stop = text[5:8]
    expected = text[: text.find(stop)]
    for include, wanted in ((False, expected), (True, expected + stop)):
        response = client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop, "never-seen"],
            stream=stream, extra_body={"include_stop_str_in_output": include},
        )  # fmt: skip
        if stream:
            chunks = [c.choices[0] for c in response if c.choices]
            got, finish = "".join(c.text for c in chunks), chunks[-1].finish_reason
        else:
            got, finish = response.choices[0].text, response.choices[0].finish_reason
        assert (got, finish) == (wanted, "stop")


def test_echo_logprobs_and_token_prompts(served, tokenizer):
    client = served.client()
    ids = tokenizer.encode(PROMPT)
    response = client.completions.create(
        model=MODEL, prompt=[ids, ids[:5]], max_tokens=4, temperature=0, echo=True, logprobs=2
    )
    assert [c.index for c in response.choices] == [0, 1]
    first = response.choices[0]
    assert first.text.startswith(PROMPT)
    assert len(first.logprobs.tokens) == len(ids) + 4 and first.logprobs.token_logprobs[0] is None
    # The two most likely, plus the prompt's own token when it is not among them.
    tops = first.logprobs.top_logprobs[1:]
    assert all(2 <= len(top) <= 3 for top in tops)
    assert all(token in top for token, top in zip(first.logprobs.tokens[1:], tops))
    assert response.usage.prompt_tokens == len(ids) + 5


def test_an_earlier_answer_can_be_sent_back_whole(served):
    client = served.client()
    first = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
    # As some clients resend it: every field of the message, unset ones as null.
    echoed = first.choices[0].message.model_dump()
    messages = [*MESSAGES, echoed, {"role": "user", "content": "And?"}]
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_chat_logprobs(served):
    response = served.client().chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2
    )
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens
    assert all(len(item.top_logprobs) == 2 and item.bytes is not None for item in content)


def test_a_repeated_prompt_is_served_from_the_same_workers_cache(served, tokenizer):
    with served.client() as client:
        first = client.completions.with_raw_response.create(
            model=MODEL, prompt=PROMPT * 3, max_tokens=2
        )
        second = client.completions.with_raw_response.create(
            model=MODEL, prompt=PROMPT * 3, max_tokens=2
        )
    assert first.headers["x-pagoda-worker"] == second.headers["x-pagoda-worker"]
    num_prompt = len(tokenizer.encode(PROMPT * 3))
    # Every full block of the prompt but the one holding its last token.
    assert second.parse().usage.prompt_tokens_details.cached_tokens == (num_prompt - 1) // 4 * 4


def test_the_async_client_streams_concurrently(served):
    async def scenario() -> tuple[list[str], list[str]]:
        client = served.async_client()

        async def whole(i: int) -> str:
            response = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"n{i}"}],
                max_tokens=8,
                temperature=0,
            )
            return response.choices[0].message.content

        async def streamed(i: int) -> str:
            stream = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"n{i}"}], max_tokens=8,
                temperature=0, stream=True,
            )  # fmt: skip
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        results = await asyncio.gather(
            *[whole(i) for i in range(4)], *[streamed(i) for i in range(4)]
        )
        await client.close()
        return results[:4], results[4:]

    wholes, streams = asyncio.run(scenario())
    assert wholes == streams


def test_a_client_that_goes_away_cancels_its_worker_request(served):
    """Cancellation goes end to end: the router's call to the worker ends with the client."""
    body = {
        "model": MODEL, "prompt": PROMPT, "max_tokens": 200, "ignore_eos": True, "stream": True,
    }  # fmt: skip
    with httpx.Client(base_url=served.base_url, headers=served.headers, timeout=60) as http:
        gone_before = requests_gone(http)
        with http.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            assert in_flight(http) == 1
        # The connection closed long before 200 tokens.
        wait_for(lambda: in_flight(http) == 0, timeout=10, what="the worker call to end")
        # A non-streamed answer has nothing to send until it is done: the disconnect is
        # listened for. 32 samples x 200 tokens take over a second even on a fast CPU
        # (8 finished in ~0.2 s on a Zen 5); the client waits 0.1 s.
        with pytest.raises(httpx.TimeoutException):
            http.post("/v1/completions", json={**body, "stream": False, "n": 32}, timeout=0.1)
        wait_for(lambda: requests_gone(http) == gone_before + 2, timeout=10, what="two 499s")
        assert in_flight(http) == 0


def requests_gone(http: httpx.Client) -> float:
    """Requests whose client went away (status 499), all APIs."""
    text = http.get("/metrics").text
    values = re.findall(
        r'^pagoda_router_requests_total\{[^}]*status="499"\} ([0-9.]+)$', text, re.M
    )
    return sum(float(v) for v in values)


def in_flight(http: httpx.Client) -> float:
    text = http.get("/metrics").text
    values = re.findall(r"^pagoda_router_worker_in_flight\{[^}]*\} ([0-9.]+)$", text, re.MULTILINE)
    return sum(float(v) for v in values)


def test_cache_salt_isolates_prefix_sharing(served):
    client = served.client()
    prompt = PROMPT * 4

    def cached(salt: str) -> int:
        response = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=1, extra_body={"cache_salt": salt}
        )
        return response.usage.prompt_tokens_details.cached_tokens

    assert cached("tenant-a") == 0
    assert cached("tenant-a") > 0  # same tenant: its own prefix, from the cache
    assert cached("tenant-b") == 0  # another tenant never reads it


def test_sse_framing_is_openais(served):
    body = {
        "model": MODEL, "messages": MESSAGES, "max_tokens": 5, "n": 2, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    with httpx.Client(base_url=served.base_url, headers=served.headers, timeout=60) as http:
        response = http.post("/v1/chat/completions", json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    raw = response.text
    assert raw.endswith("\n\ndata: [DONE]\n\n")
    events = raw.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events)
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    # A role chunk per choice first; one usage-only chunk last; usage null before it.
    assert [c["choices"][0]["delta"] for c in chunks[:2]] == [
        {"role": "assistant", "content": ""}
    ] * 2
    assert [c["choices"][0]["index"] for c in chunks[:2]] == [0, 1]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 10
    assert all(c["usage"] is None and len(c["choices"]) == 1 for c in chunks[:-1])
    finishes = [c["choices"][0] for c in chunks[:-1] if c["choices"][0]["finish_reason"]]
    assert sorted(f["index"] for f in finishes) == [0, 1]
    assert all(f["delta"] == {} for f in finishes)
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
