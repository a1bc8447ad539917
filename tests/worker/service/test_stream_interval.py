"""--stream-interval and a request's stream_interval over real gRPC: the same tokens
in fewer responses, cut where StreamHold cuts them (tests/worker/service/test_stream_hold.py)."""

from __future__ import annotations

import itertools

import grpc

from shared.proto.pagoda.worker.v1 import worker_pb2 as pb
from tests.conftest import random_prompts, wait_for
from tests.worker.service.conftest import generate, pool_is_idle, request

GREEDY = {"temperature": 0, "max_tokens": 10, "ignore_eos": True}


def ends(generation, index: int = 0) -> list[int]:
    """Where each response that carries sample `index` leaves its token count."""
    counts = [len(o.token_ids) for r in generation.responses for o in r.outputs if o.index == index]
    return list(itertools.accumulate(counts))


def test_the_workers_interval_cuts_the_stream_and_keeps_its_tokens(start_worker):
    plain = start_worker()
    held = start_worker(service={"stream_interval": 4})
    prompts = random_prompts([5, 9, 14], seed=31)
    for prompt in prompts:
        want = generate(plain.stub, prompt, **GREEDY)
        got = generate(held.stub, prompt, **GREEDY)
        assert got.token_ids() == want.token_ids()
        assert got.finish_reason() == want.finish_reason() == pb.FINISH_REASON_LENGTH
        assert got.responses[0].num_prompt_tokens == len(prompt)
        assert ends(want) == list(range(1, 11))
        # A handler that falls behind merges responses, never splits them: each cut is
        # one of StreamHold's (the first token, then every 4th, then the last).
        assert set(ends(got)) <= {1, 5, 9, 10} and ends(got)[-1] == 10
    assert held.on_engine(pool_is_idle)


def test_a_request_raises_the_interval_for_itself_and_its_samples(start_worker):
    worker = start_worker()
    prompt = random_prompts([7], seed=32)[0]
    want = generate(worker.stub, prompt, n=2, seed=5, temperature=1.0, max_tokens=10)
    got = generate(worker.stub, prompt, n=2, seed=5, temperature=1.0, max_tokens=10,
                   stream_interval=3)  # fmt: skip
    for index in (0, 1):
        assert got.token_ids(index) == want.token_ids(index)
        assert got.finish_reason(index) == want.finish_reason(index)
        # Both samples advance together; a release carries each one's held tokens.
        assert set(ends(got, index)) <= {1, 4, 7, len(got.token_ids(index))}
    assert worker.on_engine(pool_is_idle)


def test_cancel_while_tokens_are_held_frees_the_request(start_worker):
    worker = start_worker(service={"stream_interval": 1000}, max_model_len=512)
    call = worker.stub.Generate(
        request([9] * 20, temperature=0, max_tokens=400, ignore_eos=True), timeout=60
    )
    first = next(call)
    assert [len(o.token_ids) for o in first.outputs] == [1]
    call.cancel()
    wait_for(lambda: worker.on_engine(pool_is_idle), what="an idle pool")
    assert worker.stub.GetLoad(pb.GetLoadRequest()).num_steps < 400


def test_stream_interval_zero_is_invalid(start_worker):
    worker = start_worker()
    try:
        generate(worker.stub, [5, 6, 7], stream_interval=0)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "stream_interval" in exc.details()
    else:
        raise AssertionError("stream_interval 0 was accepted")
