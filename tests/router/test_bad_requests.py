"""Bad requests against `pagoda serve`: each gets its status and an OpenAI-shaped
body naming what is wrong, and the server keeps serving."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.router.conftest import API_KEY, MODEL

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
LONG = "word " * 300  # far beyond the 256-token context
LONG_IDS = [5] * 300
USER = [{"role": "user", "content": "hi"}]


def body(**fields) -> bytes:
    return json.dumps({"model": MODEL, **fields}).encode()


# (path, raw body, headers override, status, param, code, words the message must hold)
CASES = [
    (COMPLETIONS, b"{not json", None, 400, "body", None, ["not valid JSON"]),
    (COMPLETIONS, b"[1, 2]", None, 400, "body", None, ["JSON object"]),
    (COMPLETIONS, json.dumps({"prompt": "x"}).encode(), None, 400, "model", None, ["required"]),
    (COMPLETIONS, body(), None, 400, "prompt", None, ["required"]),
    (CHAT, body(), None, 400, "messages", None, ["required"]),
    (CHAT, body(messages=[]), None, 400, "messages", None, ["at least 1"]),
    (COMPLETIONS, body(prompt="x", temperature=-1), None, 400, "temperature", None, ["[0, 2]", "-1"]),
    (COMPLETIONS, body(prompt="x", top_p=1.5), None, 400, "top_p", None, ["(0, 1]", "1.5"]),
    (COMPLETIONS, body(prompt="x", n=0), None, 400, "n", None, ["[1, 128]"]),
    (COMPLETIONS, body(prompt="x", presence_penalty=3), None, 400, "presence_penalty", None, ["[-2, 2]"]),
    (COMPLETIONS, body(prompt="x", logprobs=21), None, 400, "logprobs", None, ["[0, 20]", "21"]),
    (CHAT, body(messages=USER, logprobs=True, top_logprobs=30), None, 400, "top_logprobs", None, ["[0, 20]"]),
    (CHAT, body(messages=USER, top_logprobs=2), None, 400, "top_logprobs", None, ["logprobs"]),
    (COMPLETIONS, body(prompt="x", max_tokens=0), None, 400, "max_tokens", None, [">= 1"]),
    (COMPLETIONS, body(prompt="x", max_tokens=4, min_tokens=9), None, 400, "min_tokens", None, ["<= max_tokens"]),
    (COMPLETIONS, body(prompt="x", logit_bias={"99999": 1}), None, 400, "logit_bias", None, ["99999", "vocabulary"]),
    (COMPLETIONS, body(prompt=[70000]), None, 400, "prompt", None, ["70000", "vocabulary"]),
    (COMPLETIONS, body(prompt=[]), None, 400, "prompt", None, ["empty"]),
    (COMPLETIONS, body(prompt=[[False]]), None, 400, "prompt", None, []),
    (COMPLETIONS, body(prompt=[True, 5]), None, 400, "prompt", None, []),
    (COMPLETIONS, body(prompt="x", stop_token_ids=[1.0]), None, 400, "stop_token_ids.0", None, ["integer"]),
    (COMPLETIONS, body(prompt="x", n=40, max_tokens=250), None, 400, "max_tokens", None, ["10000", "8192", "--max-tokens-per-request"]),
    (COMPLETIONS, body(prompt=["x", "y"], n=20, max_tokens=210), None, 400, "max_tokens", None, ["210+210", "8400"]),
    (COMPLETIONS, body(prompt="word " * 100_000), None, 400, "prompt", "context_length_exceeded", ["500000 characters", "--max-prompt-chars"]),
    (CHAT, body(messages=[{"role": "user", "content": "word " * 100_000}]), None, 400, "messages", "context_length_exceeded", ["500000 characters"]),
    (COMPLETIONS, body(prompt="x", stop=["a"] * 65), None, 400, "stop", None, ["64"]),
    (CHAT, body(messages=USER * 2049), None, 400, "messages", None, ["at most 2048", "got 2049", "--max-chat-messages"]),
    (COMPLETIONS, body(prompt="x", bogus=1), None, 400, "bogus", None, ["unrecognized"]),
    (COMPLETIONS, body(prompt="x", suffix="y"), None, 400, "suffix", "unsupported_parameter", ["not supported"]),
    (CHAT, body(messages=USER, tools=[{"type": "function"}]), None, 400, "tools.0.function", None, ["name"]),
    (CHAT, body(messages=USER, functions=[{"name": "f"}]), None, 400, "functions", "unsupported_parameter", []),
    (CHAT, body(messages=USER, response_format={"type": "xml"}), None, 400, "response_format.type", None, ["json_schema"]),
    (CHAT, body(messages=USER, guided_regex="a(b"), None, 400, "structured_outputs.regex", None, ["does not compile"]),
    (CHAT, body(messages=[{"role": "function", "content": "x"}]), None, 400, "messages.0.role", "unsupported_parameter", []),
    (CHAT, body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]), None, 400, "messages.0.content.0", None, ["image_url"]),
    (CHAT, body(messages=[{"role": "robot", "content": "x"}]), None, 400, "messages.0.role", None, ["robot"]),
    (CHAT, body(messages=[{"role": "user", "content": "x", "mood": "sunny"}]), None, 400, "messages.0.mood", None, ["unrecognized"]),
    (CHAT, body(messages=[{"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}]), None, 400, "messages.0.tool_calls.0.function", None, ["name"]),
    (CHAT, body(messages=[{"role": "user", "content": "x", "tool_call_id": "1"}]), None, 400, "messages.0.tool_call_id", None, ["unrecognized"]),
    (COMPLETIONS, body(prompt=LONG_IDS), None, 400, "prompt", "context_length_exceeded", ["256", "300 tokens"]),
    (COMPLETIONS, body(prompt="x", max_tokens=300), None, 400, "prompt", "context_length_exceeded", ["256", "301", "300"]),
    (CHAT, body(messages=[{"role": "user", "content": LONG}]), None, 400, "messages", "context_length_exceeded", ["256"]),
    (COMPLETIONS, json.dumps({"model": "gpt-4", "prompt": "x"}).encode(), None, 404, None, "model_not_found", ["gpt-4"]),
    (COMPLETIONS, body(prompt="x"), {"authorization": "Bearer wrong"}, 401, None, "invalid_api_key", ["incorrect"]),
    (CHAT, body(messages=USER), {}, 401, None, "invalid_api_key", ["no API key"]),
    ("/v1/nowhere", body(), None, 404, None, None, []),
]  # fmt: skip


@pytest.fixture(scope="module")
def http(served):
    with httpx.Client(base_url=served.base_url, timeout=60) as client:
        yield client


@pytest.mark.parametrize(
    "path, raw, headers, status, param, code, words",
    CASES,
    ids=[f"{c[3]}-{c[4] or c[5] or c[0]}-{i}" for i, c in enumerate(CASES)],
)
def test_bad_request_gets_its_status_and_an_openai_body(
    http, path, raw, headers, status, param, code, words
):
    headers = {"authorization": f"Bearer {API_KEY}"} if headers is None else headers
    response = http.post(path, content=raw, headers={**headers, "content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["param"], error["code"]) == (param, code)
    assert (
        error["type"]
        == {
            400: "invalid_request_error",
            401: "authentication_error",
            404: "invalid_request_error",
        }[status]
    )
    for word in words:
        assert word in error["message"], error["message"]


def test_a_body_that_is_not_json_or_too_large_is_refused_before_parsing(http, served):
    raw = body(prompt="x", max_tokens=2)
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        response = http.post(
            COMPLETIONS, content=raw, headers={**served.headers, "content-type": content_type}
        )
        assert response.status_code == 415, response.text
        error = response.json()["error"]
        assert error["code"] == "unsupported_media_type" and content_type in error["message"]
    # JSON with a charset, and a body that says nothing of its type, are read as JSON.
    for content_type in ("application/json; charset=utf-8", None):
        headers = {**served.headers, **({"content-type": content_type} if content_type else {})}
        assert http.post(COMPLETIONS, content=raw, headers=headers).status_code == 200
    huge = b'{"model": "tiny", "prompt": "' + b"x" * (33 * 2**20) + b'"}'
    response = http.post(COMPLETIONS, content=huge, headers=served.headers)
    assert response.status_code == 413, response.text
    assert "--max-request-body-bytes" in response.json()["error"]["message"]


def test_a_huge_prompt_is_refused_at_once_and_streams_beside_it_keep_flowing(http, served):
    """10 MB of text would take seconds to tokenize; it is refused by its length, and
    the event loop never stops serving a running stream or /health meanwhile."""
    import threading
    import time

    gaps: list[float] = []

    def stream() -> None:
        with httpx.stream(
            "POST", f"{served.base_url}{COMPLETIONS}", headers=served.headers,
            json={"model": MODEL, "prompt": "go", "max_tokens": 200, "ignore_eos": True,
                  "stream": True}, timeout=60,
        ) as response:  # fmt: skip
            last = time.monotonic()
            for _ in response.iter_lines():
                now = time.monotonic()
                gaps.append(now - last)
                last = now

    reader = threading.Thread(target=stream)
    reader.start()
    huge = json.dumps({"model": MODEL, "prompt": "lorem ipsum " * 900_000})  # ~10 MB
    started = time.monotonic()
    response = http.post(COMPLETIONS, content=huge, headers=served.headers)
    refused_in = time.monotonic() - started
    reader.join(60)
    assert response.status_code == 400 and "--max-prompt-chars" in response.text
    assert refused_in < 5, refused_in  # not tokenized: parsing 10 MB of JSON is all it costs
    assert len(gaps) > 100 and max(gaps[1:]) < 5, max(gaps[1:])


def test_the_server_keeps_serving_after_bad_requests(http, served):
    for path, raw, *_ in CASES:
        http.post(path, content=raw, headers=served.headers)
    response = http.post(
        COMPLETIONS, content=body(prompt="still here", max_tokens=3), headers=served.headers
    )
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 3
    served.router.process.check_alive()


def test_health_and_metrics_need_no_key_the_api_does(http):
    health = http.get("/health")
    assert health.status_code == 200 and health.json()["workers_serving"] == 2
    assert http.get("/v1/models").status_code == 401
    metrics = http.get("/metrics").text
    for name in (
        "pagoda_router_requests_total",
        "pagoda_router_time_to_first_token_seconds_bucket",
        "pagoda_router_inter_token_latency_seconds_bucket",
        "pagoda_router_e2e_request_latency_seconds_bucket",
        "pagoda_router_prompt_tokens_total",
        "pagoda_router_generation_tokens_total",
        "pagoda_router_cached_tokens_total",
        'pagoda_router_routing_decisions_total{reason="affinity"}',
        "pagoda_router_worker_in_flight",
        'pagoda_router_store_up{store="local"} 1.0',
    ):
        assert name in metrics, name
    assert 'pagoda_router_requests_total{api="completions",status="400"}' in metrics
