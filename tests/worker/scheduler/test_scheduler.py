"""Scheduler scenarios with hand-made runner outputs: exact token counts, block ids,
preemption victims and queue order. Pool integrity is checked after every step."""

from __future__ import annotations

from shared.sampling_params import SamplingParams
from worker.config import CacheConfig, SchedulerConfig
from worker.request import Request, RequestStatus
from worker.scheduler.output import ModelRunnerOutput, SchedulerOutput
from worker.scheduler.scheduler import Scheduler

BLOCK = 4
EOS = 2


def make_scheduler(
    num_blocks=32, budget=64, max_num_seqs=8, chunked=True, policy="fcfs", caching=True
):
    return Scheduler(
        SchedulerConfig(
            max_num_batched_tokens=budget,
            max_num_seqs=max_num_seqs,
            enable_chunked_prefill=chunked,
            scheduling_policy=policy,
        ),
        CacheConfig(block_size=BLOCK, enable_prefix_caching=caching),
        num_blocks,
    )


def make_request(request_id, num_tokens, max_tokens=8, priority=0, start=None, **params):
    # Distinct token ranges per request unless a test wants shared prefixes.
    index = int(request_id[1:]) if request_id[1:].isdigit() else 0
    start = 100 * index + 10 if start is None else start
    return Request(
        request_id,
        list(range(start, start + num_tokens)),
        SamplingParams(max_tokens=max_tokens, **params),
        eos_token_ids=(EOS,),
        max_tokens=max_tokens,
        priority=priority,
        arrival_time=float(int(request_id[1:]) if request_id[1:].isdigit() else 0),
        block_size=BLOCK,
    )


def run_step(
    scheduler: Scheduler, tokens: dict[str, int] | None = None, default=7
) -> SchedulerOutput:
    """Schedule, then pretend the model sampled `default` (or tokens[id]) for every
    request whose computed tokens reached its end."""
    output = scheduler.schedule()
    sampled = {}
    for request_id in output.num_scheduled_tokens:
        request = scheduler.requests[request_id]
        if request.num_computed_tokens == request.num_tokens:
            sampled[request_id] = (tokens or {}).get(request_id, default)
    scheduler.update_from_output(output, ModelRunnerOutput(sampled_token_ids=sampled))
    scheduler.kv.pool.check_integrity()
    return output


def test_fcfs_admission_within_token_budget():
    s = make_scheduler(budget=16)
    for request_id, n in [("r0", 10), ("r1", 6), ("r2", 8)]:
        s.add_request(make_request(request_id, n))
    out = run_step(s)
    assert out.num_scheduled_tokens == {"r0": 10, "r1": 6}
    assert [(r.req_id, r.block_ids, r.num_computed_tokens) for r in out.scheduled_new_reqs] == [
        ("r0", [0, 1, 2], 0),
        ("r1", [3, 4], 0),
    ]
    # Running requests decode first, then r2 gets the rest of the budget.
    out = run_step(s)
    assert out.num_scheduled_tokens == {"r0": 1, "r1": 1, "r2": 8}
    # Positions 10 and 6 still fit in r0's and r1's last blocks.
    assert [(c.req_id, c.new_block_ids) for c in out.scheduled_cached_reqs] == [
        ("r0", []),
        ("r1", []),
    ]
    assert out.scheduled_new_reqs[0].block_ids == [5, 6]


def test_chunked_prefill_splits_a_long_prompt_and_samples_at_the_end():
    s = make_scheduler(budget=8)
    s.add_request(make_request("r0", 20))
    chunks = []
    for _ in range(3):
        out = run_step(s)
        chunks.append(out.num_scheduled_tokens["r0"])
        assert s.requests["r0"].output_token_ids == ([] if len(chunks) < 3 else [7])
    assert chunks == [8, 8, 4]
    assert run_step(s).num_scheduled_tokens == {"r0": 1}


def test_without_chunking_a_prompt_waits_for_a_whole_budget():
    s = make_scheduler(budget=12, chunked=False)
    s.add_request(make_request("r0", 8))
    s.add_request(make_request("r1", 8))
    assert run_step(s).num_scheduled_tokens == {"r0": 8}
    assert run_step(s).num_scheduled_tokens == {"r0": 1, "r1": 8}


def test_max_num_seqs_caps_the_running_set():
    s = make_scheduler(max_num_seqs=2)
    for i in range(3):
        s.add_request(make_request(f"r{i}", 4))
    assert list(run_step(s).num_scheduled_tokens) == ["r0", "r1"]
    assert len(s.waiting) == 1


def test_preemption_takes_the_newest_and_resumes_it_from_the_cache():
    # 6 blocks: r0 (7 tokens) and r1 (8 tokens) take 2 blocks each, leaving 2.
    s = make_scheduler(num_blocks=6, budget=32)
    s.add_request(make_request("r0", 7, max_tokens=12))
    s.add_request(make_request("r1", 8, max_tokens=12, start=50))
    run_step(s)
    assert s.kv.get_block_ids("r0") == [0, 1] and s.kv.get_block_ids("r1") == [2, 3]
    # r1 needs a third block at once (token 9), r0 at its 9th token: both fit, pool now full.
    run_step(s)
    run_step(s)
    assert s.kv.pool.num_free_blocks == 0
    preempted = []
    while not preempted:
        out = run_step(s)
        preempted = sorted(out.preempted_req_ids)
    assert preempted == ["r1"]
    r1 = s.requests["r1"]
    assert r1.status == RequestStatus.PREEMPTED and r1.num_computed_tokens == 0
    assert s.waiting.peek() is r1 and s.num_preemptions == 1
    # Freed tail-first: r1's blocks queue as 4, 3, 2, and r0's growth evicts 4 then 3.
    assert list(s.kv.pool._free_queue) == [4, 3, 2]
    # r0 runs alone to completion; then r1 comes back, resuming with a full block table.
    resumed = None
    while resumed is None:
        out = run_step(s)
        resumed = next((c for c in out.scheduled_cached_reqs if c.resumed_from_preemption), None)
    assert resumed.req_id == "r1"
    assert resumed.new_block_ids == s.kv.get_block_ids("r1")
    # Its first block (tokens 0-3) survived in the prefix cache: only the rest is recomputed.
    assert resumed.new_block_ids[0] == 2
    assert resumed.num_computed_tokens == 4
    while s.has_unfinished_requests():
        run_step(s)
    assert s.kv.num_used_blocks == 0


def test_no_admission_in_a_step_that_preempted():
    s = make_scheduler(num_blocks=4, budget=32)
    s.add_request(make_request("r0", 8, max_tokens=12))
    s.add_request(make_request("r1", 4, max_tokens=12, start=60))
    run_step(s)  # r0: blocks 0,1; r1: block 2 (+ 1 spare)
    s.add_request(make_request("r2", 2, start=90))
    outs = [run_step(s) for _ in range(6)]
    for out in outs:
        if out.preempted_req_ids:
            assert not out.scheduled_new_reqs


def test_abort_frees_blocks_and_tells_the_runner():
    s = make_scheduler()
    s.add_request(make_request("r0", 9))
    s.add_request(make_request("r1", 5))
    run_step(s)
    s.finish_requests(["r0"], RequestStatus.FINISHED_ABORTED)
    assert s.kv.get_block_ids("r0") == []
    out = run_step(s)
    assert out.finished_req_ids == {"r0"}
    assert list(out.num_scheduled_tokens) == ["r1"]
    s.finish_requests(["r1", "unknown"], RequestStatus.FINISHED_ABORTED)
    assert not s.has_unfinished_requests() and s.kv.num_used_blocks == 0


def test_abort_while_waiting():
    s = make_scheduler(max_num_seqs=1)
    s.add_request(make_request("r0", 4))
    s.add_request(make_request("r1", 4))
    run_step(s)
    s.finish_requests(["r1"], RequestStatus.FINISHED_ABORTED)
    assert len(s.waiting) == 0


def test_priority_policy_orders_admission_and_picks_victims():
    s = make_scheduler(num_blocks=8, budget=64, policy="priority", max_num_seqs=2)
    s.add_request(make_request("r0", 4, priority=5))
    s.add_request(make_request("r1", 4, priority=0, start=40))
    s.add_request(make_request("r2", 4, priority=1, start=80))
    out = run_step(s)
    assert list(out.num_scheduled_tokens) == ["r1", "r2"]
    assert [r.request_id for r in s.running] == ["r1", "r2"]


def test_stop_conditions():
    s = make_scheduler()
    s.add_request(make_request("eos", 3))
    s.add_request(make_request("ignore", 3, ignore_eos=True, max_tokens=2, start=20))
    s.add_request(make_request("stop_id", 3, stop_token_ids=(9,), start=30))
    s.add_request(make_request("min", 3, min_tokens=2, max_tokens=3, start=40))
    deltas = {}
    for _ in range(3):
        out = s.schedule()
        sampled = {
            "eos": EOS,
            "ignore": EOS,
            "stop_id": 9,
            "min": EOS,
        }
        sampled = {k: v for k, v in sampled.items() if k in out.num_scheduled_tokens}
        for delta in s.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled)):
            deltas.setdefault(delta.request_id, []).append(delta)
    finals = {k: v[-1] for k, v in deltas.items()}
    assert (len(deltas["eos"]), finals["eos"].finish_reason) == (1, "stop")
    assert (len(deltas["ignore"]), finals["ignore"].finish_reason) == (2, "length")
    assert (finals["stop_id"].finish_reason, finals["stop_id"].stop_reason) == ("stop", 9)
    # EOS before min_tokens is generated does not stop it.
    assert (len(deltas["min"]), finals["min"].finish_reason) == (2, "stop")
    assert not s.has_unfinished_requests()


def test_prefix_cache_stats_count_admitted_lookups_once():
    s = make_scheduler()
    s.add_request(make_request("r0", 10))
    run_step(s)
    s.add_request(make_request("r1", 10, start=10))
    run_step(s)
    stats = s.make_stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (20, 8)
    assert s.requests["r1"].num_cached_tokens == 8
