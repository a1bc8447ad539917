"""One token budget per step, shared by decode, prefill and chunked prefill.

Each step: running requests first (each gets what it still needs, usually one
token), then waiting requests in queue order, as long as the budget, the
sequence limit and the KV pool allow. A running request that cannot get a
block preempts the lowest-priority running request (the newest under FCFS),
whose blocks are freed and which is later recomputed from its tokens.

The scheduler never touches tensors: it decides, the runner computes.
"""

from __future__ import annotations

from collections.abc import Iterable

from worker.config import CacheConfig, SchedulerConfig
from worker.kv_cache.kv_cache_manager import KVCacheManager
from worker.outputs import RequestDelta
from worker.request import Request, RequestStatus
from worker.scheduler.output import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from worker.scheduler.request_queue import make_queue
from worker.stats import SchedulerStats

# Blocks kept spare when admitting new requests so that running ones can grow
# without an immediate preemption.
WATERMARK_FRACTION = 0.01


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        cache_config: CacheConfig,
        num_blocks: int,
        record_kv_events: bool = False,
    ) -> None:
        self.config = config
        self.kv = KVCacheManager(
            num_blocks,
            cache_config.block_size,
            cache_config.enable_prefix_caching,
            record_events=record_kv_events,
        )
        self.requests: dict[str, Request] = {}
        self.waiting = make_queue(config.scheduling_policy)
        self.running: list[Request] = []
        self._finished_req_ids: set[str] = set()
        self.num_preemptions = 0
        self.step_count = 0
        self.watermark_blocks = int(WATERMARK_FRACTION * num_blocks)

    # ---- requests in and out -------------------------------------------------

    def add_request(self, request: Request) -> None:
        assert request.request_id not in self.requests, f"duplicate request id {request.request_id}"
        self.requests[request.request_id] = request
        self.waiting.add(request)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> None:
        """Remove requests wherever they are (e.g. aborts) and free their blocks."""
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            request.status = status
            self._release(request)

    def _release(self, request: Request) -> None:
        self.kv.free(request)
        self._finished_req_ids.add(request.request_id)
        del self.requests[request.request_id]

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ---- one step ------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        num_scheduled: dict[str, int] = {}
        new_reqs: list[NewRequestData] = []
        cached_reqs: list[CachedRequestData] = []
        preempted: set[str] = set()

        i = 0
        running, allocate_slots = self.running, self.kv.allocate_slots
        while i < len(running) and budget > 0:
            request = running[i]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            new_blocks = allocate_slots(request, num_new)
            while new_blocks is None:
                victim = running.pop()
                self._preempt(victim)
                preempted.add(victim.request_id)
                if victim is request:
                    break
                new_blocks = allocate_slots(request, num_new)
            if new_blocks is None:
                break
            num_scheduled[request.request_id] = num_new
            budget -= num_new
            cached_reqs.append(
                CachedRequestData(
                    request.request_id,
                    [b.block_id for b in new_blocks],
                    request.num_computed_tokens,
                )
            )
            i += 1

        # After a preemption the pool is known to be short: admit nobody new.
        while (
            not preempted
            and len(self.waiting)
            and budget > 0
            and len(self.running) < self.config.max_num_seqs
        ):
            request = self.waiting.peek()
            hits, num_hit = self.kv.get_computed_blocks(request)
            num_new = request.num_tokens - num_hit
            if not self.config.enable_chunked_prefill and num_new > budget:
                break
            num_new = min(num_new, budget)
            reserve = self.watermark_blocks if self.running else 0
            if self.kv.allocate_slots(request, num_new, hits, reserve) is None:
                break
            self.waiting.pop()
            resumed = request.status == RequestStatus.PREEMPTED
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_hit
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_hit
            self.kv.record_prefix_lookup(request.num_tokens, num_hit)
            self.running.append(request)
            num_scheduled[request.request_id] = num_new
            budget -= num_new
            block_ids = self.kv.get_block_ids(request.request_id)
            if resumed:
                cached_reqs.append(CachedRequestData(request.request_id, block_ids, num_hit, True))
            else:
                new_reqs.append(
                    NewRequestData(
                        request.request_id,
                        request.prompt_token_ids,
                        request.sampling_params,
                        block_ids,
                        num_hit,
                        request.grammar,
                        list(request.output_token_ids),
                    )
                )

        if self.config.scheduling_policy == "priority":
            self.running.sort(key=lambda r: (r.priority, r.arrival_time))
        for request_id, num_new in num_scheduled.items():
            self.requests[request_id].num_computed_tokens += num_new
        total = sum(num_scheduled.values())
        assert total <= self.config.max_num_batched_tokens
        assert len(self.running) <= self.config.max_num_seqs
        assert all(self.requests[r].status == RequestStatus.RUNNING for r in num_scheduled)
        output = SchedulerOutput(
            new_reqs, cached_reqs, num_scheduled, total, self._finished_req_ids, preempted
        )
        self._finished_req_ids = set()
        self.step_count += 1
        return output

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.add_preempted(request)

    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[RequestDelta]:
        """Append sampled tokens, finish requests that stop, report what changed."""
        deltas = []
        requests = self.requests
        sampled = runner_output.sampled_token_ids
        # Most steps carry neither: no lookups per request then.
        all_prompt_logprobs = runner_output.prompt_logprobs or None
        all_logprobs = runner_output.logprobs or None
        grammar_ended = runner_output.grammar_ended
        for request_id in scheduler_output.num_scheduled_tokens:
            request = requests.get(request_id)
            if request is None:  # aborted while the step ran
                continue
            token = sampled.get(request_id)
            prompt_logprobs = (
                None if all_prompt_logprobs is None else all_prompt_logprobs.get(request_id)
            )
            if token is None:
                if prompt_logprobs is not None:
                    deltas.append(
                        RequestDelta(
                            request_id,
                            [],
                            prompt_logprobs=prompt_logprobs,
                            num_cached_tokens=request.num_cached_tokens,
                            num_prompt_tokens=request.num_prompt_tokens,
                        )
                    )
                continue
            request.append_output_token(token)
            logprobs = None if all_logprobs is None else all_logprobs.get(request_id)
            delta = RequestDelta(
                request_id,
                [token],
                new_logprobs=None if logprobs is None else [logprobs],
                prompt_logprobs=prompt_logprobs,
                num_cached_tokens=request.num_cached_tokens,
                num_prompt_tokens=request.num_prompt_tokens,
            )
            if request.check_stop(request_id in grammar_ended):
                self.running.remove(request)
                self._release(request)
                delta.finish_reason = request.status.finish_reason
                delta.stop_reason = request.stop_reason
            deltas.append(delta)
        return deltas

    def make_stats(self, num_scheduled_tokens: int = 0) -> SchedulerStats:
        pool = self.kv.pool
        return SchedulerStats(
            step=self.step_count,
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_scheduled_tokens=num_scheduled_tokens,
            num_kv_blocks_total=pool.num_blocks,
            num_kv_blocks_used=self.kv.num_used_blocks,
            num_kv_blocks_cached_free=pool.num_cached_free_blocks,
            kv_slots_allocated=self.kv.num_slots_allocated(),
            kv_tokens_held=sum(r.num_computed_tokens for r in self.running),
            prefix_cache_queries=self.kv.prefix_cache_queries,
            prefix_cache_hits=self.kv.prefix_cache_hits,
            num_preemptions=self.num_preemptions,
        )
