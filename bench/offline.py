"""`pagoda bench offline`: our engine's offline API over a workload, one JSON line each.

Every request is greedy with `ignore_eos`, so it produces exactly its max_tokens;
the run fails loudly if one does not (the figures would be for other work). All
requests are submitted at once, as `LLM.generate` takes them. Timing covers
`generate` alone: the model loads and one short warm-up runs before the clock
starts. KV figures come from the engine's per-step stats (bench/step_stats.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from bench.jsonl import emit
from bench.machine import describe_machine
from bench.offline_result import OfflineResult
from bench.step_stats import StepStatsRecorder
from bench.workloads import FIRST_TOKEN_ID, Workload, resolve_workloads
from shared.cli_args import dataclass_to_args
from worker.config import EngineConfig


def engine_flags(config: EngineConfig) -> list[str]:
    """The engine flags of `config` that differ from their defaults (model aside)."""
    flags: list[str] = []
    for group in dataclasses.fields(config):
        flags += dataclass_to_args(getattr(config, group.name), skip=("model",))
    return flags


def warm_up(llm) -> None:
    """A few steps through prefill and decode, so lazy one-time work (kernel builds,
    allocator growth) is not timed. The prompts repeat one token: no random
    workload shares a block with them, so they add no prefix-cache hits."""
    from worker import SamplingParams

    prompts = [[FIRST_TOKEN_ID] * 32, [FIRST_TOKEN_ID + 1] * 24]
    llm.generate(
        prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), detokenize=False
    )


def run_offline(llm, workload: Workload, model: str) -> OfflineResult:
    """Generate every request of `workload` with `llm` (an `LLM`), timed."""
    from worker import SamplingParams

    prompts = [list(r.prompt_token_ids) for r in workload.requests]
    params = [
        SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True)
        for r in workload.requests
    ]
    recorder = StepStatsRecorder(before=llm.last_stats)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, detokenize=False, on_step=recorder)
    elapsed = time.perf_counter() - start

    for i, (request, output) in enumerate(zip(workload.requests, outputs)):
        produced = len(output.outputs[0].token_ids)
        if produced != request.max_tokens:
            raise RuntimeError(
                f"request {i} produced {produced} tokens, not its max_tokens "
                f"{request.max_tokens}: ignore_eos was not honoured"
            )
    kv = recorder.figures()
    config = llm.engine.config
    return OfflineResult(
        engine="pagoda",
        model=model,
        workload=workload.name,
        seed=workload.seed,
        requests=len(workload.requests),
        prompt_tokens=workload.num_prompt_tokens,
        output_tokens=sum(len(o.outputs[0].token_ids) for o in outputs),
        elapsed_s=elapsed,
        dtype=str(llm.engine.core.dtype).removeprefix("torch."),
        prefix_caching=config.cache.enable_prefix_caching,
        prefix_cache_hit_rate=kv.prefix_cache_hit_rate,
        cached_prompt_tokens=sum(o.num_cached_tokens for o in outputs),
        preemptions=kv.num_preemptions,
        peak_kv_blocks=kv.peak_kv_blocks,
        peak_kv_use=kv.peak_kv_use,
        kv_waste=kv.kv_waste,
        weight_bytes=_weight_bytes(llm),
        flags=engine_flags(config),
        machine=describe_machine(),
    )


def _weight_bytes(llm) -> int | None:
    """Per decoded token, as stored; None where the model is in other processes (TP)."""
    from bench.weight_bytes import stored_weight_bytes

    try:
        model = llm.engine.core.runner.model
    except AttributeError:
        return None
    return stored_weight_bytes(model)


def main(args: argparse.Namespace) -> int:
    config = EngineConfig.from_cli_args(args)
    if args.baseline is not None:
        from bench.hf_baseline import main as baseline_main

        return baseline_main(args, config)
    from worker import LLM

    llm = LLM(config=config)
    vocab_size = llm.engine.vocab_size
    workloads = resolve_workloads(args.workload, args.seed, vocab_size, args.num_requests)
    warm_up(llm)
    for workload in workloads:
        result = run_offline(llm, workload, model=config.model.model)
        emit(result.to_json(), args.output)
    return 0
