"""Generate over real gRPC: concurrency, streaming, sampling options, model info, load."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from shared.block_hash import BLOCK_HASH_SCHEME
from shared.proto.pagoda.worker.v1 import worker_pb2 as pb
from tests.conftest import random_prompts
from tests.worker.service.conftest import generate, pool_is_idle, request, wait_for

LENGTHS = [1, 2, 3, 5, 7, 8, 9, 12, 15, 16, 17, 20, 23, 24, 25, 30] * 2


def test_32_concurrent_streams_equal_each_run_alone(start_worker):
    worker = start_worker(num_kv_blocks=600)
    prompts = random_prompts(LENGTHS, seed=11)
    prompts[16:] = [[*p, 7] for p in prompts[16:]]  # 32 distinct prompts
    alone = [generate(worker.stub, p, temperature=0, max_tokens=16) for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(
            pool.map(lambda p: generate(worker.stub, p, temperature=0, max_tokens=16), prompts)
        )
    assert [g.token_ids() for g in together] == [g.token_ids() for g in alone]
    assert all(g.finish_reason() != pb.FINISH_REASON_UNSPECIFIED for g in together)
    # Tokens stream as steps produce them, not at the end.
    num_tokens = sum(len(g.token_ids()) for g in alone)
    assert all(len(g.responses) >= 2 for g in alone if len(g.token_ids()) >= 2)
    assert sum(len(g.responses) for g in alone) >= num_tokens // 2
    assert worker.on_engine(pool_is_idle)


def test_first_response_counts_prompt_and_cached_tokens(start_worker):
    worker = start_worker()
    prompt = random_prompts([18], seed=12)[0]
    first = generate(worker.stub, prompt, temperature=0, max_tokens=4, ignore_eos=True)
    again = generate(worker.stub, prompt, temperature=0, max_tokens=4, ignore_eos=True)
    head = first.responses[0]
    assert head.HasField("num_prompt_tokens") and head.num_prompt_tokens == 18
    assert head.HasField("num_cached_tokens") and head.num_cached_tokens == 0
    # 18 tokens = 4 full blocks of 4 cached by the first run.
    assert again.responses[0].num_cached_tokens == 16
    assert not any(r.HasField("num_prompt_tokens") for r in first.responses[1:])
    assert again.token_ids() == first.token_ids()
    assert first.finish_reason() == pb.FINISH_REASON_LENGTH


def test_sampling_options_round_trip(start_worker):
    worker = start_worker()
    prompt = random_prompts([10], seed=13)[0]
    got = generate(
        worker.stub,
        prompt,
        n=3,
        temperature=0.9,
        seed=5,
        max_tokens=6,
        ignore_eos=True,
        logprobs=2,
        prompt_logprobs=1,
    )
    outputs = [o for r in got.responses for o in r.outputs]
    assert {o.index for o in outputs} == {0, 1, 2}
    for index in range(3):
        assert len(got.token_ids(index)) == 6
        logprobs = [lp for o in outputs if o.index == index for lp in o.logprobs]
        assert [lp.token_id for lp in logprobs] == got.token_ids(index)
        assert all(len(lp.top) == 2 and lp.rank >= 1 for lp in logprobs)
    # The first prompt token has no logprob.
    prompt_logprobs = [lp for r in got.responses for lp in r.prompt_logprobs]
    assert [lp.token_id for lp in prompt_logprobs] == prompt[1:]
    # Seeded sampling repeats itself.
    again = generate(
        worker.stub, prompt, n=3, temperature=0.9, seed=5, max_tokens=6, ignore_eos=True
    )
    assert [again.token_ids(i) for i in range(3)] == [got.token_ids(i) for i in range(3)]


def test_stop_token_ends_with_stop_reason(start_worker):
    worker = start_worker()
    prompt = random_prompts([6], seed=14)[0]
    free = generate(worker.stub, prompt, temperature=0, max_tokens=8, ignore_eos=True)
    stop = free.token_ids()[3]
    got = generate(
        worker.stub, prompt, temperature=0, max_tokens=8, ignore_eos=True, stop_token_ids=[stop]
    )
    cut = free.token_ids().index(stop) + 1
    assert got.token_ids() == free.token_ids()[:cut]
    last = got.responses[-1].outputs[-1]
    assert last.finish_reason == pb.FINISH_REASON_STOP
    assert last.HasField("stop_token_id") and last.stop_token_id == stop


def test_model_info_matches_the_engine(start_worker):
    worker = start_worker(max_num_seqs=7, service={"max_waiting": 9, "worker_id": "w-info"})
    info = worker.stub.GetModelInfo(pb.GetModelInfoRequest())
    engine = worker.engine
    assert info.architecture == "LlamaForCausalLM"
    assert info.vocab_size == engine.spec.vocab_size == 512
    assert info.max_model_len == 128 and info.block_size == 4
    assert info.num_kv_blocks == 256 and info.kv_capacity_tokens == 1024
    assert info.block_hash_scheme == BLOCK_HASH_SCHEME
    assert list(info.eos_token_ids) == list(engine.spec.eos_token_ids)
    assert info.HasField("bos_token_id") and info.bos_token_id == engine.spec.bos_token_id
    assert info.max_num_seqs == 7 and info.max_waiting == 9 and info.max_logprobs == 20
    assert info.worker_id == "w-info" and info.epoch > 0
    assert info.served_model_name == info.model == str(engine.spec.path)


def test_load_rises_while_requests_run_and_falls_back(start_worker):
    worker = start_worker(max_model_len=512)
    idle = worker.stub.GetLoad(pb.GetLoadRequest())
    assert idle.num_running_requests == 0 and idle.num_kv_blocks_used == 0
    assert idle.num_kv_blocks_total == 256
    prompts = random_prompts([40, 50, 60], seed=15)
    results = []
    threads = [
        threading.Thread(
            target=lambda p=p: results.append(
                generate(worker.stub, p, temperature=0, max_tokens=400, ignore_eos=True)
            )
        )
        for p in prompts
    ]
    for t in threads:
        t.start()
    busy = wait_for(
        lambda: (
            load
            if (load := worker.stub.GetLoad(pb.GetLoadRequest())).num_running_requests == 3
            and load.decode_tokens_per_second > 0
            else None
        ),
        what="three running requests in GetLoad",
    )
    assert busy.num_kv_blocks_used >= sum(-(-len(p) // 4) for p in prompts)
    assert busy.num_active_streams == 3 and busy.prefill_tokens_per_second > 0
    assert busy.num_steps > idle.num_steps
    for t in threads:
        t.join(60)
    assert [len(r.token_ids()) for r in results] == [400] * 3
    after = worker.stub.GetLoad(pb.GetLoadRequest())
    assert after.num_running_requests == after.num_waiting_requests == 0
    assert after.num_kv_blocks_used == 0 and after.num_active_streams == 0
    assert after.num_queued_prefill_tokens == 0
    assert after.num_kv_blocks_cached > 0  # the prompts stay cached after they finish
    assert after.prefix_cache_queries >= sum(len(p) for p in prompts)


def test_queued_prefill_tokens_count_waiting_prompts(start_worker):
    worker = start_worker(max_num_seqs=1, max_model_len=512)
    long_call = worker.stub.Generate(
        request([5] * 8, temperature=0, max_tokens=400, ignore_eos=True), timeout=60
    )
    next(long_call)  # running now
    waiting_call = worker.stub.Generate(request([6] * 30, temperature=0, max_tokens=1), timeout=60)
    load = wait_for(
        lambda: (
            load
            if (load := worker.stub.GetLoad(pb.GetLoadRequest())).num_waiting_requests == 1
            else None
        ),
        what="one waiting request",
    )
    assert load.num_running_requests == 1 and load.num_queued_prefill_tokens == 30
    long_call.cancel()
    assert len(list(waiting_call)) == 1
