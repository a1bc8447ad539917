"""vLLM's routes beside the OpenAI ones (/tokenize, /detokenize, /version, /ping, the
model card of /v1/models), X-Request-Id, and the access log, through httpx and the
openai client against the session's `pagoda serve` (--enable-request-id-headers)."""

from __future__ import annotations

import importlib.metadata

import httpx
import pytest

from tests.cluster import http_up, start_router
from tests.conftest import wait_for
from tests.router.conftest import MODEL

PROMPT = "The pagoda stood on the hill and"


def post(served, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{served.base_url}{path}", json=body, headers=served.headers, timeout=30)


def test_tokenize_gives_the_ids_a_completion_of_the_prompt_counts(served, tokenizer):
    answer = post(served, "/tokenize", {"model": MODEL, "prompt": PROMPT})
    assert answer.status_code == 200, answer.text
    ids = tokenizer.encode(PROMPT)
    assert answer.json() == {
        "count": len(ids),
        "max_model_len": 256,
        "tokens": ids,
        "token_strs": None,
    }
    completion = served.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=1)
    assert completion.usage.prompt_tokens == len(ids)
    # model may be left out; token_strs are the vocabulary's pieces
    pieces = post(served, "/tokenize", {"prompt": PROMPT, "return_token_strs": True}).json()
    assert pieces["tokens"] == ids
    assert pieces["token_strs"] == [tokenizer.backend.id_to_token(i) for i in ids]


def test_tokenize_messages_renders_the_chat_template_as_chat_does(served):
    messages = [{"role": "user", "content": PROMPT}]
    answer = post(served, "/tokenize", {"model": MODEL, "messages": messages}).json()
    chat = served.client().chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert answer["count"] == len(answer["tokens"]) == chat.usage.prompt_tokens
    without = post(
        served, "/tokenize", {"messages": messages, "add_generation_prompt": False}
    ).json()
    assert without["count"] < answer["count"]
    assert answer["tokens"][: without["count"]] == without["tokens"]


def test_detokenize_inverts_tokenize_and_names_what_is_wrong(served, tokenizer):
    ids = tokenizer.encode(PROMPT)
    answer = post(served, "/detokenize", {"model": MODEL, "tokens": ids})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"prompt": PROMPT}
    bad = post(served, "/detokenize", {"tokens": [1, 10**9]})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "tokens"
    assert "10000000" in bad.json()["error"]["message"]
    unknown = post(served, "/tokenize", {"model": "other", "prompt": "x"})
    assert unknown.status_code == 404
    both = post(served, "/tokenize", {"prompt": "x", "messages": [{"role": "user"}]})
    assert both.status_code == 400
    assert both.json()["error"]["param"] == "prompt"
    unauthorized = httpx.post(f"{served.base_url}/tokenize", json={"prompt": "x"}, timeout=10)
    assert unauthorized.status_code == 401


def test_version_ping_and_the_model_card(served, make_checkpoint):
    version = httpx.get(f"{served.base_url}/version", timeout=10)
    assert version.json() == {"version": importlib.metadata.version("pagoda")}
    assert httpx.get(f"{served.base_url}/ping", timeout=10).status_code == 200
    assert httpx.post(f"{served.base_url}/ping", timeout=10).status_code == 200
    models = httpx.get(f"{served.base_url}/v1/models", headers=served.headers, timeout=10).json()
    (card,) = models["data"]
    assert card["id"] == MODEL
    assert card["max_model_len"] == 256
    assert card["root"] == str(make_checkpoint("llama"))
    assert card["parent"] is None
    assert card["permission"][0]["object"] == "model_permission"
    assert card["permission"][0]["allow_sampling"] is True


@pytest.mark.parametrize("stream", [False, True])
def test_x_request_id_names_the_response_and_comes_back(served, stream):
    client = served.client()
    kwargs = dict(model=MODEL, max_tokens=2, stream=stream)
    raw = client.completions.with_raw_response.create(
        prompt=PROMPT, extra_headers={"X-Request-Id": f"mine-{stream}"}, **kwargs
    )
    assert raw.headers["x-request-id"] == f"mine-{stream}"
    parsed = raw.parse()
    ids = {chunk.id for chunk in parsed} if stream else {parsed.id}
    assert ids == {f"cmpl-mine-{stream}"}
    chat = client.chat.completions.with_raw_response.create(
        messages=[{"role": "user", "content": PROMPT}],
        extra_headers={"X-Request-Id": f"chat-{stream}"},
        **kwargs,
    )
    assert chat.headers["x-request-id"] == f"chat-{stream}"
    parsed = chat.parse()
    ids = {chunk.id for chunk in parsed} if stream else {parsed.id}
    assert ids == {f"chatcmpl-chat-{stream}"}
    # Without one, the router makes one up and answers with it.
    fresh = client.completions.with_raw_response.create(prompt=PROMPT, max_tokens=1, model=MODEL)
    assert fresh.parse().id == f"cmpl-{fresh.headers['x-request-id']}"

    def logged() -> bool:
        return any(
            line.endswith(f"request_id=mine-{stream} worker={raw.headers['x-pagoda-worker']}")
            and "POST /v1/completions 200 " in line
            for line in served.router.process.log().splitlines()
        )

    wait_for(logged, timeout=10, interval=0.1, what="the access log line")


def test_without_the_flags_no_header_comes_back_and_no_line_is_logged(tmp_path):
    """A router whose one worker does not exist: /ping says 503, and
    --disable-log-requests keeps requests out of its log."""
    router = start_router(
        "router", ["--worker=127.0.0.1:9", "--disable-log-requests"], tmp_path / "r.log"
    )
    try:
        wait_for(lambda: http_up(router), timeout=60, interval=0.2, what="the router's HTTP port")
        ping = httpx.get(f"{router.base_url}/ping", headers={"X-Request-Id": "r1"}, timeout=5)
        assert ping.status_code == 503
        assert "x-request-id" not in ping.headers
        refused = httpx.post(f"{router.base_url}/tokenize", json={"prompt": "x"}, timeout=5)
        assert refused.status_code == 503
    finally:
        router.process.stop()
    assert "request_id=" not in router.process.log()
