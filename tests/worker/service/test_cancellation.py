"""A cancelled, timed-out or abandoned stream aborts its request and frees its blocks."""

from __future__ import annotations

import threading

import grpc
import pytest

from shared.proto.pagoda.worker.v1 import worker_pb2 as pb
from shared.proto.pagoda.worker.v1 import worker_pb2_grpc as pb_grpc
from tests.conftest import random_prompts, wait_for
from tests.worker.service.conftest import (
    generate,
    load_when,
    one_running_one_waiting,
    pool_is_idle,
    request,
)

# ~1000 steps: long enough that no call below could end by finishing.
LONG = dict(temperature=0, max_tokens=990, ignore_eos=True)


def pool_state(engine) -> tuple[int, int]:
    pool = engine.core.scheduler.kv.pool
    pool.check_integrity()
    return pool.num_free_blocks, pool.num_blocks


@pytest.mark.parametrize("how", ["cancel", "deadline", "disconnect"])
def test_an_ended_call_frees_its_blocks(start_worker, how):
    worker = start_worker(max_model_len=1024)
    # A fresh worker's first tokens took 210-370 ms on a loaded 2-core box, past the
    # deadline below; a quiet one streams all 990 tokens in under a second.
    generate(worker.stub, [5, 6, 7], temperature=0, max_tokens=2)
    start = worker.on_engine(pool_state)
    steps_before = worker.stub.GetLoad(pb.GetLoadRequest()).num_steps
    assert start[0] == start[1]
    prompt = random_prompts([30], seed=21)[0]
    channel = grpc.insecure_channel(worker.address)
    stub = pb_grpc.WorkerServiceStub(channel)
    call = stub.Generate(request(prompt, **LONG), timeout=0.25 if how == "deadline" else 60)
    received = [next(call), next(call)]  # mid-stream: the request holds blocks
    assert worker.stub.GetLoad(pb.GetLoadRequest()).num_kv_blocks_used > 0
    if how == "cancel":
        call.cancel()
    elif how == "disconnect":
        channel.close()
    else:
        with pytest.raises(grpc.RpcError) as caught:
            received.extend(call)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    num_tokens = sum(len(o.token_ids) for r in received for o in r.outputs)
    assert num_tokens < LONG["max_tokens"]  # it really ended early
    wait_for(lambda: worker.on_engine(pool_is_idle), what="the blocks to return to the pool")
    assert worker.on_engine(pool_state) == start
    load = worker.stub.GetLoad(pb.GetLoadRequest())
    assert load.num_running_requests == 0 and load.num_active_streams == 0
    # The engine stopped it: it did not run on to max_tokens unseen. Relative to what
    # the client saw, since a fast CPU streams hundreds of tokens before a deadline.
    assert load.num_steps - steps_before < num_tokens + LONG["max_tokens"] // 4
    # The worker serves on.
    assert len(generate(worker.stub, prompt, temperature=0, max_tokens=3).token_ids()) == 3
    channel.close()


def test_cancel_of_a_waiting_request_frees_its_place(start_worker):
    worker = start_worker(max_num_seqs=1, max_model_len=512)
    running, waiting = one_running_one_waiting(worker, [9] * 20, [8] * 20)
    waiting.cancel()
    load_when(worker, lambda load: load.num_waiting_requests == 0, "no waiting request")
    assert worker.stub.GetLoad(pb.GetLoadRequest()).num_running_requests == 1
    running.cancel()
    wait_for(lambda: worker.on_engine(pool_is_idle), what="an idle pool")
    # Neither ran to its 400 tokens.
    assert worker.stub.GetLoad(pb.GetLoadRequest()).num_steps < 400


def test_a_waiting_request_already_has_its_headers(start_worker):
    # A caller cancelling before any headers came back leaks native memory in grpcio
    # (grpc/grpc#43360); the worker sends them when the call starts, so a request still
    # queued behind another has them.
    worker = start_worker(max_num_seqs=1, max_model_len=512)
    running, waiting = one_running_one_waiting(worker, [9] * 20, [8] * 20)
    headers: list = []
    reader = threading.Thread(target=lambda: headers.append(waiting.initial_metadata()))
    reader.start()
    reader.join(timeout=30)
    assert headers == [()]
    assert worker.stub.GetLoad(pb.GetLoadRequest()).num_waiting_requests == 1
    waiting.cancel()
    running.cancel()
    wait_for(lambda: worker.on_engine(pool_is_idle), what="an idle pool")
