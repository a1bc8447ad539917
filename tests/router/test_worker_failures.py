"""A worker that fails, on purpose: before its first token the request moves to another
worker unseen; after it, the request is resumed on another worker with the tokens
already sent, and the client's stream goes on.

The failing worker is a fault-injecting gRPC server in this process that announces the
same model as a real worker of `pagoda serve` (and reports SERVING); the router is a
real `pagoda router` process over both.
"""

from __future__ import annotations

import re
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


class FaultyWorker(wpb_grpc.WorkerServiceServicer):
    """Fails every Generate: at once ("before"), or after one token ("after")."""

    def __init__(self, info: wpb.GetModelInfoResponse) -> None:
        self.info = info
        self.mode = "before"
        self.num_calls = 0

    def Generate(self, request, context):
        self.num_calls += 1
        if self.mode == "after":
            yield wpb.GenerateResponse(
                outputs=[wpb.SampleOutput(index=0, token_ids=[70])],
                num_prompt_tokens=len(request.prompt_token_ids),
                num_cached_tokens=0,
            )
        context.abort(grpc.StatusCode.UNAVAILABLE, "injected failure")

    def GetModelInfo(self, request, context):
        return self.info

    def GetLoad(self, request, context):
        return wpb.GetLoadResponse()


@pytest.fixture(scope="module")
def faulty_cluster(served, tmp_path_factory):
    port = re.search(r"started worker 0 \(pid \d+\) on port (\d+)", served.router.process.log())
    real = f"127.0.0.1:{port.group(1)}"
    with grpc.insecure_channel(real) as channel:
        info = wpb_grpc.WorkerServiceStub(channel).GetModelInfo(wpb.GetModelInfoRequest())
    info.worker_id, info.epoch = "a-faulty", 1  # sorts first: it wins ties
    faulty = FaultyWorker(info)
    server = grpc.server(futures.ThreadPoolExecutor(4))
    wpb_grpc.add_WorkerServiceServicer_to_server(faulty, server)
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    faulty_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    log = tmp_path_factory.mktemp("faulty") / "router.log"
    router = start_router("router", [f"--worker=127.0.0.1:{faulty_port}", f"--worker={real}"], log)
    try:
        wait_serving(router.process, router.base_url, 2)
        client = openai.OpenAI(base_url=f"{router.base_url}/v1", api_key="x", max_retries=0)
        yield faulty, router, client
    finally:
        router.process.stop()
        server.stop(0)


def retries(router) -> float:
    text = httpx.get(f"{router.base_url}/metrics", timeout=5).text
    return float(re.search(r"^pagoda_router_retries_total ([0-9.]+)$", text, re.M).group(1))


def test_a_failure_before_the_first_token_moves_the_request_unseen(faulty_cluster):
    faulty, router, client = faulty_cluster
    faulty.mode, calls_before, retries_before = "before", faulty.num_calls, retries(router)
    for i in range(4):
        for stream in (False, True):
            raw = client.completions.with_raw_response.create(
                model=MODEL,
                prompt=f"retry me {i}",
                max_tokens=4,
                stream=stream,
                extra_body={"ignore_eos": True},  # sampled: an EOS would end it early
            )
            assert raw.status_code == 200 and raw.headers["x-pagoda-worker"] != "a-faulty"
            if stream:
                assert [c for c in raw.parse() if c.choices][-1].choices[0].finish_reason
            else:
                assert raw.parse().usage.completion_tokens == 4
    assert faulty.num_calls > calls_before  # it was chosen, failed, and was stepped over
    assert retries(router) >= retries_before + (faulty.num_calls - calls_before)


def migrations(router) -> float:
    text = httpx.get(f"{router.base_url}/metrics", timeout=5).text
    return float(re.search(r"^pagoda_router_migrations_total ([0-9.]+)$", text, re.M).group(1))


def test_a_failure_after_the_first_token_resumes_the_request_elsewhere(faulty_cluster):
    faulty, router, client = faulty_cluster
    faulty.mode, moved = "after", migrations(router)
    # Whole answers: the faulty worker's token stands; the real worker generates the rest.
    whole = client.completions.with_raw_response.create(
        model=MODEL, prompt="whole", max_tokens=4, extra_body={"ignore_eos": True}
    )
    assert whole.headers["x-pagoda-worker"] != "a-faulty"
    assert whole.parse().usage.completion_tokens == 4
    assert whole.parse().choices[0].finish_reason == "length"
    # (The failure took it out of rotation until its health watch said SERVING again.)
    wait_serving(router.process, router.base_url, 2)
    # A stream that already carries the faulty worker's token goes on from it, unbroken.
    with client.completions.with_streaming_response.create(
        model=MODEL,
        prompt="stream",
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    ) as raw:
        assert raw.headers["x-pagoda-worker"] == "a-faulty"
        chunks = list(raw.parse())
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 4
    assert migrations(router) == moved + 2


def test_a_worker_failing_after_its_last_token_finishes_the_answer_as_length(faulty_cluster):
    faulty, router, client = faulty_cluster
    faulty.mode, moved = "after", migrations(router)
    wait_serving(router.process, router.base_url, 2)
    # The faulty worker sends the one token asked for, then fails: nothing to resume.
    with client.completions.with_streaming_response.create(
        model=MODEL, prompt="one", max_tokens=1, stream=True, stream_options={"include_usage": True}
    ) as raw:
        assert raw.headers["x-pagoda-worker"] == "a-faulty"
        chunks = list(raw.parse())
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 1
    assert migrations(router) == moved
