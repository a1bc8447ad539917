"""What a failover carries over, checked against an undisturbed run of the same request.

Two proxies in this process stand in front of one real worker of `pagoda serve`:
"a-proxy" forwards Generate and, when told to, ends the call with UNAVAILABLE
after a number of responses, as a worker failing mid-stream would; "b-proxy"
forwards and reports a heavy load, so that a real `pagoda router` over both sends
every request to a-proxy first and resumes it on b-proxy after the failure. Every
token comes from the same real model, so the whole answer must equal the
undisturbed one exactly: text of every choice (n > 1 too, seeded), logprobs,
stop strings cut across the failover, usage; and the header, the finish chunks
and the metrics say where it went.
"""

from __future__ import annotations

import re
import time
from concurrent import futures

import grpc
import httpx
import openai
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb
from shared.proto.pagoda.worker.v1 import worker_pb2_grpc as wpb_grpc
from tests.cluster import start_router, wait_serving
from tests.router.conftest import MODEL

PROXY = "a-proxy"
SPARE = "b-proxy"
SEEDED = {"temperature": 1.0, "top_p": 0.9, "seed": 11}
MAX_TOKENS = 12
PROMPT = "failover carries every piece of state over to the next worker " * 2


class FailingProxy(wpb_grpc.WorkerServiceServicer):
    """Forwards to a real worker; with fail_after = k, aborts after k responses (or
    before the last one, if there are fewer)."""

    def __init__(
        self, stub: wpb_grpc.WorkerServiceStub, info: wpb.GetModelInfoResponse, extra_load: int = 0
    ) -> None:
        self.stub, self.info, self.extra_load = stub, info, extra_load
        self.fail_after: int | None = None
        self.sent = 0  # sample 0's tokens forwarded before the failure

    def Generate(self, request, context):
        call = self.stub.Generate(request)
        try:
            responses = iter(call)
            response, i = next(responses, None), 0
            while response is not None:
                following = next(responses, None)
                # A worker behind a slow reader packs several tokens into a response, so
                # there may be fewer than fail_after of them: it then fails before its last.
                if self.fail_after is not None and (i == self.fail_after or following is None):
                    context.abort(grpc.StatusCode.UNAVAILABLE, "injected failure")
                self.sent += sum(len(o.token_ids) for o in response.outputs if o.index == 0)
                yield response
                response, i = following, i + 1
        finally:
            call.cancel()

    def GetModelInfo(self, request, context):
        return self.info

    def GetLoad(self, request, context):
        load = self.stub.GetLoad(request)
        load.num_queued_prefill_tokens += self.extra_load
        return load


def start_proxy(proxy: FailingProxy) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(16))
    wpb_grpc.add_WorkerServiceServicer_to_server(proxy, server)
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


@pytest.fixture(scope="module")
def proxied(served, tmp_path_factory):
    port = re.search(r"started worker 0 \(pid \d+\) on port (\d+)", served.router.process.log())
    channel = grpc.insecure_channel(f"127.0.0.1:{port.group(1)}")
    stub = wpb_grpc.WorkerServiceStub(channel)
    proxies, servers, flags = [], [], ["--routing-policy=load", "--load-interval=0.2"]
    for name, extra_load in ((PROXY, 0), (SPARE, 100_000)):
        info = stub.GetModelInfo(wpb.GetModelInfoRequest())
        info.worker_id, info.epoch = name, 1
        proxies.append(FailingProxy(stub, info, extra_load))
        server, proxy_port = start_proxy(proxies[-1])
        servers.append(server)
        flags.append(f"--worker=127.0.0.1:{proxy_port}")
    router = start_router("router", flags, tmp_path_factory.mktemp("proxy") / "router.log")
    try:
        wait_serving(router.process, router.base_url, 2)
        time.sleep(1.0)  # b-proxy's heavy load reported
        client = openai.OpenAI(base_url=f"{router.base_url}/v1", api_key="x", max_retries=0)
        yield proxies[0], router, client, SPARE, info.block_size
    finally:
        router.process.stop()
        for server in servers:
            server.stop(0)
        channel.close()


def counter(router, name: str, labels: str = "") -> float:
    text = httpx.get(f"{router.base_url}/metrics", timeout=5).text
    found = re.search(rf"^pagoda_router_{name}_total{re.escape(labels)} ([0-9.]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def through_proxy(router, proxy, fail_after: int | None, send):
    """send() -> (answer, its x-pagoda-worker header), the proxy failing after
    `fail_after` responses; once both proxies serve (a failure takes one out)."""
    wait_serving(router.process, router.base_url, 2)
    proxy.fail_after, proxy.sent = fail_after, 0
    return send()


def complete(client, proxy, router, fail_after: int | None, **params):
    """(whole answer, its x-pagoda-worker header), the proxy failing after `fail_after`."""

    def send():
        raw = client.completions.with_raw_response.create(
            model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, **params
        )
        return raw.parse(), raw.headers["x-pagoda-worker"]

    return through_proxy(router, proxy, fail_after, send)


def stream(client, proxy, router, fail_after: int | None, **params):
    """(chunks, header) of a streamed answer with usage."""

    def send():
        with client.completions.with_streaming_response.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
            **params,
        ) as raw:
            return list(raw.parse()), raw.headers["x-pagoda-worker"]

    return through_proxy(router, proxy, fail_after, send)


def texts(chunks, n: int) -> list[str]:
    out = [""] * n
    for chunk in chunks:
        for choice in chunk.choices:
            out[choice.index] += choice.text
    return out


@pytest.mark.parametrize("fail_after", [1, 4])
def test_n_greater_than_one_resumes_each_choice_with_its_own_seeded_draws(proxied, fail_after):
    proxy, router, client, real_id, _ = proxied
    params = {**SEEDED, "n": 3, "extra_body": {"ignore_eos": True}}
    want, _ = complete(client, proxy, router, None, **params)
    moved, unavailable = (
        counter(router, "migrations"),
        counter(router, "failovers", '{reason="unavailable"}'),
    )
    got, header = complete(client, proxy, router, fail_after, **params)
    # Every choice moved on its own: the proxy first, then the real worker once per choice.
    assert header == ",".join([PROXY] + [real_id] * 3)
    assert [c.text for c in got.choices] == [c.text for c in want.choices]
    assert [c.finish_reason for c in got.choices] == ["length"] * 3
    assert got.usage.completion_tokens == 3 * MAX_TOKENS
    chunks, header = stream(client, proxy, router, fail_after, **params)
    assert header == PROXY
    assert texts(chunks, 3) == [c.text for c in want.choices]
    finishes = [c for chunk in chunks for c in chunk.choices if c.finish_reason]
    assert sorted((c.index, c.finish_reason) for c in finishes) == [(i, "length") for i in range(3)]
    # The last finish chunk and the usage chunk name every worker, in order.
    assert chunks[-1].model_extra["pagoda_worker"] == ",".join([PROXY] + [real_id] * 3)
    assert chunks[-1].usage.completion_tokens == 3 * MAX_TOKENS
    assert counter(router, "migrations") == moved + 2
    assert counter(router, "failovers", '{reason="unavailable"}') == unavailable + 2


def test_logprobs_usage_and_the_header_carry_over(proxied):
    proxy, router, client, real_id, block_size = proxied
    params = {"temperature": 0, "logprobs": 2, "extra_body": {"ignore_eos": True}}
    want, _ = complete(client, proxy, router, None, **params)
    got, header = complete(client, proxy, router, 5, **params)
    assert header == f"{PROXY},{real_id}"
    assert got.choices[0].text == want.choices[0].text
    assert got.choices[0].logprobs.tokens == want.choices[0].logprobs.tokens
    assert got.choices[0].logprobs.token_logprobs == pytest.approx(
        want.choices[0].logprobs.token_logprobs, abs=1e-4
    )
    assert got.choices[0].logprobs.top_logprobs == [
        pytest.approx(top, abs=1e-4) for top in want.choices[0].logprobs.top_logprobs
    ]
    # The client's prompt counts once; the resumed prefill (prompt + the tokens so far)
    # is reported beside it, with what the real worker had cached of it: the real
    # worker ran this very request undisturbed, so every full block but the last token's.
    num_prompt = want.usage.prompt_tokens
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (num_prompt, MAX_TOKENS)
    details = got.usage.prompt_tokens_details
    assert details.cached_tokens == want.usage.prompt_tokens_details.cached_tokens
    resumed = num_prompt + proxy.sent
    assert details.model_extra["resumed_prefill_tokens"] == resumed
    assert details.model_extra["resumed_cached_tokens"] == (resumed - 1) // block_size * block_size
    assert "resumed_prefill_tokens" not in want.usage.prompt_tokens_details.model_extra


def test_a_stop_string_across_the_failover_and_the_detokenizer_state_carry_over(proxied):
    proxy, router, client, real_id, _ = proxied
    params = {"temperature": 0, "extra_body": {"ignore_eos": True}}
    undisturbed, _ = stream(client, proxy, router, None, **params)
    full = texts(undisturbed, 1)[0]
    # Text streamed token by token, cut at several points: the incremental detokenizer's
    # state (prefix offsets, a character split over tokens) must go on unbroken.
    for fail_after in (1, 2, 3):
        chunks, _ = stream(client, proxy, router, fail_after, logprobs=0, **params)
        assert chunks[-1].model_extra["pagoda_worker"] == f"{PROXY},{real_id}"
        assert texts(chunks, 1) == [full]
    # With logprobs, a chunk per worker response: the first 3 are what the proxy sent.
    boundary = len("".join(c.choices[0].text for c in chunks[:3]))
    assert 0 < boundary < len(full) - 2
    # A stop string that begins in what the proxy sent and ends in what the real worker
    # generated after the failover.
    start = next(s for s in range(boundary - 1, -1, -1) if full.find(full[s : boundary + 2]) == s)
    stop = full[start : boundary + 2]
    got, _ = complete(client, proxy, router, 3, stop=[stop], **params)
    assert got.choices[0].text == full[:start]
    assert (got.choices[0].finish_reason, got.choices[0].stop_reason) == ("stop", stop)
