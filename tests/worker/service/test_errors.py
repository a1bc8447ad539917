"""Every bad input and every failure ends its call with the right status; the worker
serves on."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from shared.proto.pagoda.worker.v1 import worker_pb2 as pb
from tests.conftest import wait_for
from tests.worker.service.conftest import (
    generate,
    one_running_one_waiting,
    pool_is_idle,
    request,
)

OK_PROMPT = [5, 6, 7]
INVALID = grpc.StatusCode.INVALID_ARGUMENT
# (case id, request, field the message must name); the tiny model: vocab 512, context 128.
CASES = [
    ("empty-prompt", request([]), "prompt"),
    ("token-above-vocab", request([1, 512]), "prompt"),
    ("negative-token", request([1, -1]), "prompt"),
    ("prompt-fills-context", request([1] * 128), "prompt"),
    ("max-tokens-past-context", request([1] * 100, max_tokens=29), "max_tokens"),
    ("max-tokens-zero", request(OK_PROMPT, max_tokens=0), "max_tokens"),
    ("n-zero", request(OK_PROMPT, n=0), "n"),
    ("temperature-negative", request(OK_PROMPT, temperature=-0.5), "temperature"),
    ("temperature-nan", request(OK_PROMPT, temperature=float("nan")), "temperature"),
    ("top-p-zero", request(OK_PROMPT, top_p=0.0), "top_p"),
    ("top-p-above-one", request(OK_PROMPT, top_p=1.5), "top_p"),
    ("top-k-below-minus-one", request(OK_PROMPT, top_k=-2), "top_k"),
    ("min-p-above-one", request(OK_PROMPT, min_p=2.0), "min_p"),
    ("presence-penalty", request(OK_PROMPT, presence_penalty=3.0), "presence_penalty"),
    ("frequency-penalty", request(OK_PROMPT, frequency_penalty=-2.5), "frequency_penalty"),
    ("repetition-penalty-zero", request(OK_PROMPT, repetition_penalty=0.0), "repetition_penalty"),
    ("min-tokens-above-max", request(OK_PROMPT, max_tokens=2, min_tokens=5), "min_tokens"),
    ("min-tokens-negative", request(OK_PROMPT, min_tokens=-1), "min_tokens"),
    ("logprobs-above-20", request(OK_PROMPT, logprobs=21), "logprobs"),
    ("prompt-logprobs-negative", request(OK_PROMPT, prompt_logprobs=-1), "prompt_logprobs"),
    ("stream-interval-zero", request(OK_PROMPT, stream_interval=0), "stream_interval"),
    ("stop-token-outside-vocab", request(OK_PROMPT, stop_token_ids=[9999]), "stop_token_ids"),
    ("logit-bias-token", request(OK_PROMPT, logit_bias={600: 1.0}), "logit_bias"),
    ("logit-bias-value", request(OK_PROMPT, logit_bias={5: 101.0}), "logit_bias"),
    ("request-id-too-long", request(OK_PROMPT, request_id="x" * 257), "request_id"),
    ("temperature-above-two", request(OK_PROMPT, temperature=2.5), "temperature"),
    ("n-above-128", request(OK_PROMPT, n=129), "n"),
    (
        "allowed-token-outside-vocab",
        request(OK_PROMPT, allowed_token_ids=[3, 512]),
        "allowed_token_ids",
    ),
    (
        "bad-word-outside-vocab",
        request(OK_PROMPT, bad_words_token_ids=[pb.TokenIds(ids=[3, 700])]),
        "bad_words",
    ),
    ("stop-strings-are-the-routers", request(OK_PROMPT, stop=["x"]), "sampling_params.stop"),
    (
        "bad-words-text-is-the-routers",
        request(OK_PROMPT, bad_words=["x"]),
        "sampling_params.bad_words",
    ),
    (
        "priority-under-fcfs",
        pb.GenerateRequest(prompt_token_ids=OK_PROMPT, priority=1),
        "priority",
    ),
    (
        "schema-does-not-compile",
        request(OK_PROMPT, structured_outputs=pb.StructuredOutputs(json='{"type": "strin"}')),
        "structured_outputs.json",
    ),
    (
        "regex-does-not-compile",
        request(OK_PROMPT, structured_outputs=pb.StructuredOutputs(regex="a(b")),
        "structured_outputs.regex",
    ),
    (
        "empty-constraint",
        request(OK_PROMPT, structured_outputs=pb.StructuredOutputs()),
        "structured_outputs",
    ),
    (
        "cache-salt-too-long",
        pb.GenerateRequest(prompt_token_ids=OK_PROMPT, cache_salt=b"s" * 1025),
        "cache_salt",
    ),
]


@pytest.fixture(scope="module")
def shared_worker(make_checkpoint):
    # One worker for the whole table: each case must leave it able to serve the next.
    from tests.worker.service.conftest import ENGINE, InProcessWorker
    from worker.config import EngineConfig
    from worker.service.config import WorkerServiceConfig

    config = EngineConfig.from_kwargs(model=str(make_checkpoint("llama")), **ENGINE)
    worker = InProcessWorker(config, WorkerServiceConfig(host="127.0.0.1", port=0, redis_url=None))
    yield worker.start()
    worker.stop()


@pytest.mark.parametrize("bad, field", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_input_is_invalid_argument_naming_the_field(shared_worker, bad, field):
    with pytest.raises(grpc.RpcError) as caught:
        list(shared_worker.stub.Generate(bad, timeout=30))
    assert caught.value.code() == INVALID, caught.value.details()
    assert caught.value.details().startswith(f"{field}:"), caught.value.details()
    assert generate(shared_worker.stub, OK_PROMPT, max_tokens=2).token_ids()  # still serving
    assert shared_worker.on_engine(pool_is_idle)


def test_full_waiting_queue_is_resource_exhausted(start_worker):
    worker = start_worker(max_num_seqs=1, max_model_len=512, service={"max_waiting": 1})
    running, waiting = one_running_one_waiting(worker, [3] * 10, [4] * 10)
    with pytest.raises(grpc.RpcError) as caught:
        list(worker.stub.Generate(request([5] * 10, max_tokens=2), timeout=30))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-waiting 1" in caught.value.details()
    # More samples than may ever wait can never be queued: not retryable.
    with pytest.raises(grpc.RpcError) as caught:
        list(worker.stub.Generate(request([5] * 10, n=2, max_tokens=2), timeout=30))
    assert caught.value.code() == INVALID
    assert (
        caught.value.details()
        == "n: 2 samples can never wait here at once (--max-waiting 1); lower n"
    )
    running.cancel()
    waiting.cancel()
    wait_for(lambda: worker.on_engine(pool_is_idle), what="an idle pool")
    assert len(generate(worker.stub, [5] * 10, max_tokens=2).token_ids()) == 2


def test_engine_failure_fails_the_streams_with_internal_and_serves_on(start_worker):
    worker = start_worker()
    runner = worker.engine.core.runner
    real_execute = runner.execute_model
    calls = {"n": 0}

    def fail_once(output):
        # Fail the first step that has work: after scheduling, as a real fault would.
        if not output.is_empty and calls["n"] == 0:
            calls["n"] += 1
            raise RuntimeError("injected fault")
        return real_execute(output)

    worker.on_engine(lambda engine: setattr(runner, "execute_model", fail_once))
    with pytest.raises(grpc.RpcError) as caught:
        list(worker.stub.Generate(request([7] * 9, max_tokens=4), timeout=30))
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert "injected fault" in caught.value.details()
    assert worker.on_engine(pool_is_idle)
    assert len(generate(worker.stub, [7] * 9, temperature=0, max_tokens=4).token_ids()) == 4


def test_health_and_reflection(start_worker):
    worker = start_worker()
    health = health_pb2_grpc.HealthStub(worker.channel)
    for service in ("", "pagoda.worker.v1.WorkerService"):
        status = health.Check(health_pb2.HealthCheckRequest(service=service)).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(worker.channel)
    answer = next(
        reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
    )
    names = {s.name for s in answer.list_services_response.service}
    assert {"pagoda.worker.v1.WorkerService", "grpc.health.v1.Health"} <= names


def test_draining_worker_refuses_new_requests_unavailable(start_worker):
    worker = start_worker(max_model_len=512)
    call = worker.stub.Generate(
        request([3] * 10, temperature=0, max_tokens=60, ignore_eos=True), timeout=60
    )
    first = next(call)
    future = asyncio.run_coroutine_threadsafe(worker.server.drain_and_stop(timeout=30), worker.loop)
    health = health_pb2_grpc.HealthStub(worker.channel)
    wait_for(
        lambda: (
            health.Check(health_pb2.HealthCheckRequest()).status
            == health_pb2.HealthCheckResponse.NOT_SERVING
        ),
        what="NOT_SERVING",
    )
    with pytest.raises(grpc.RpcError) as caught:
        list(worker.stub.Generate(request([3] * 10, max_tokens=2), timeout=30))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    # The in-flight request finishes whole (a chunk may carry several steps' tokens
    # when the client reads slower than the engine steps, the first one included).
    chunks = [first, *call]
    assert sum(len(o.token_ids) for r in chunks for o in r.outputs) == 60
    future.result(30)


def test_drain_timeout_fails_what_is_left_unavailable(start_worker):
    worker = start_worker(max_model_len=1024)
    call = worker.stub.Generate(
        request([3] * 10, temperature=0, max_tokens=990, ignore_eos=True), timeout=60
    )
    next(call)
    future = asyncio.run_coroutine_threadsafe(
        worker.server.drain_and_stop(timeout=0.2), worker.loop
    )
    with pytest.raises(grpc.RpcError) as caught:
        list(call)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "shut down before the request finished" in caught.value.details()
    future.result(30)
