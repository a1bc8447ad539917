"""The worker's Generate fuzzed with hypothesis-built messages over real gRPC: every
message is answered (tokens, or INVALID_ARGUMENT naming a field), none crashes or
hangs the worker, and the KV pool is idle afterwards. A short run by default; a
long one under `-m slow`."""

from __future__ import annotations

import os

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from shared.proto.pagoda.v1 import sampling_pb2
from shared.proto.pagoda.worker.v1 import worker_pb2 as pb
from tests.worker.service.conftest import pool_is_idle

VOCAB = 512  # the tiny checkpoint's
LONG = int(os.environ.get("PAGODA_FUZZ_EXAMPLES", "500"))

token = st.integers(-3, VOCAB + 3) | st.integers(-(2**31), 2**31 - 1)
small = st.integers(-3, 24)
real = st.floats(-3, 3) | st.floats(allow_nan=True, allow_infinity=True)
OPTIONAL = {
    "n": st.integers(-1, 4) | st.just(129),
    "temperature": real,
    "top_p": real,
    "top_k": small | st.integers(-(2**31), 2**31 - 1),
    "min_p": real,
    "seed": st.integers(-(2**63), 2**63 - 1),
    "presence_penalty": real,
    "frequency_penalty": real,
    "repetition_penalty": real,
    "max_tokens": small | st.integers(-(2**31), 2**31 - 1),
    "min_tokens": small,
    "ignore_eos": st.booleans(),
    "logprobs": small,
    "prompt_logprobs": small,
    "skip_special_tokens": st.booleans(),  # a router field: refused by the worker
    "truncate_prompt_tokens": small,  # likewise
}


@st.composite
def sampling_params(draw) -> sampling_pb2.SamplingParams:
    msg = sampling_pb2.SamplingParams()
    for name, values in OPTIONAL.items():
        if draw(st.booleans()):
            setattr(msg, name, draw(values))
    msg.logit_bias.update(draw(st.dictionaries(token, real, max_size=4)))
    msg.stop_token_ids.extend(draw(st.lists(token, max_size=3)))
    msg.allowed_token_ids.extend(draw(st.lists(token, max_size=3)))
    for word in draw(st.lists(st.lists(token, max_size=3), max_size=2)):
        msg.bad_words_token_ids.add(ids=word)
    if draw(st.integers(0, 9)) == 0:
        msg.stop.append(draw(st.text(max_size=5)))
    return msg


@st.composite
def generate_requests(draw) -> pb.GenerateRequest:
    request = pb.GenerateRequest(
        request_id=draw(st.text(max_size=8) | st.just("x" * 300)),
        prompt_token_ids=draw(st.lists(token, max_size=12) | st.just([7] * 200)),
        sampling_params=draw(sampling_params()),
        output_token_ids=draw(st.lists(token, max_size=4)),
    )
    if draw(st.booleans()):
        request.priority = draw(small)
    if draw(st.booleans()):
        request.cache_salt = draw(st.binary(max_size=8) | st.just(b"s" * 2000))
    return request


def check(stub, request: pb.GenerateRequest) -> None:
    try:
        responses = list(stub.Generate(request, timeout=60))
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), exc.details())
        field, _, message = exc.details().partition(": ")
        assert field and message, exc.details()
        event(f"INVALID_ARGUMENT {field}")
        return
    event("answered")
    assert responses and all(
        o.finish_reason != pb.FINISH_REASON_UNSPECIFIED
        for o in responses[-1].outputs
        if o.token_ids or o.finish_reason
    )


@pytest.fixture(scope="module")
def fuzzed_worker(make_checkpoint):
    from tests.worker.service.conftest import ENGINE, InProcessWorker
    from worker.config import EngineConfig
    from worker.service.config import WorkerServiceConfig

    config = EngineConfig.from_kwargs(model=str(make_checkpoint("llama")), **ENGINE)
    worker = InProcessWorker(config, WorkerServiceConfig(host="127.0.0.1", port=0, redis_url=None))
    worker.start()
    yield worker
    assert worker.on_engine(pool_is_idle)
    worker.stop()


@given(request=generate_requests())
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzzed_generate_is_answered_or_invalid_argument(fuzzed_worker, request):
    check(fuzzed_worker.stub, request)


@pytest.mark.slow
@given(request=generate_requests())
@settings(max_examples=LONG, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzzed_generate_long_run(fuzzed_worker, request):
    check(fuzzed_worker.stub, request)
