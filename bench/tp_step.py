"""Per-step time at tensor-parallel size 2 against 1, and where TP=2's goes.

    PYTHONPATH=$PWD python -m bench.tp_step [--batch 8 --prompt-len 64 --max-tokens 32]

A SmolLM2-135M-shaped random checkpoint with 8 query / 2 KV heads (the real
model's 9 heads do not split in two) runs the same batch at TP=1 and TP=2,
alternating (--repeats times each), in one process, so both see the same
machine load. For the decode steps with the whole batch running it reports
the median step time, and at TP=2 the shares of rank 0's step spent in
collectives (all-reduce / all-gather, gloo) and in the step broadcast
(pickling and writing the SchedulerOutput, copying and unpickling it on the
rank) plus the engine's wait for rank 0's answer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = REPO_ROOT / "bench" / "results" / "tmp" / "smollm2-135m-shaped-8h"


def build_checkpoint(path: Path) -> Path:
    if (path / "config.json").exists():
        return path
    import torch

    from bench.checkpoints import SMOLLM2_135M_SHAPE, build_random_checkpoint

    shape = {**SMOLLM2_135M_SHAPE, "num_attention_heads": 8, "num_key_value_heads": 2}
    return build_random_checkpoint(path, "llama", dtype=torch.bfloat16, **shape)


def run_once(path: Path, tp: int, args) -> dict:
    from worker import SamplingParams
    from worker.config import EngineConfig
    from worker.engine.llm_engine import LLMEngine

    config = EngineConfig.from_kwargs(
        model=str(path), tensor_parallel_size=tp, max_model_len=512, num_kv_blocks=512
    )
    engine = LLMEngine(config, offline=True)
    executor = engine.core.executor
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    try:
        for i in range(args.batch):
            engine.add_request(
                str(i), [3 + (i * 7 + j) % 400 for j in range(args.prompt_len)], params
            )
        steps, marks = [], None
        while engine.has_unfinished_requests():
            is_steady = (
                engine.core.scheduler.running
                and all(
                    r.num_computed_tokens >= r.num_prompt_tokens
                    for r in engine.core.scheduler.running
                )
                and len(engine.core.scheduler.running) == args.batch
            )
            if is_steady and marks is None and tp > 1:
                marks = (executor.rank_stats(), executor.put_seconds, executor.wait_seconds)
            start = time.perf_counter()
            engine.step()
            if is_steady:
                steps.append(time.perf_counter() - start)
        result = {"tp": tp, "decode_steps": len(steps), "step_ms": 1e3 * statistics.median(steps)}
        if tp > 1:
            end = executor.rank_stats()
            rank_step = end["step_seconds"] - marks[0]["step_seconds"]
            collective = end["collective_seconds"] - marks[0]["collective_seconds"]
            read = end["broadcast_read_seconds"] - marks[0]["broadcast_read_seconds"]
            put = executor.put_seconds - marks[1]
            wall = sum(steps)
            calls = end["collective_calls"] - marks[0]["collective_calls"]
            result |= {
                "collectives_per_step": calls / len(steps),
                "us_per_collective": 1e6 * collective / max(calls, 1),
                "collective_share_of_rank_step": collective / rank_step,
                "broadcast_share_of_step": (put + read) / wall,
                "broadcast_us_per_step": 1e6 * (put + read) / len(steps),
                "engine_wait_share": (executor.wait_seconds - marks[2]) / wall,
            }
        return result
    finally:
        engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--checkpoint", type=Path, default=CHECKPOINT)
    args = parser.parse_args()
    path = build_checkpoint(args.checkpoint)
    runs = [run_once(path, tp, args) for _ in range(args.repeats) for tp in (1, 2)]
    for run in runs:
        print(json.dumps(run))
    one = statistics.median(r["step_ms"] for r in runs if r["tp"] == 1)
    two = statistics.median(r["step_ms"] for r in runs if r["tp"] == 2)
    print(json.dumps({"tp1_step_ms": one, "tp2_step_ms": two, "tp2_over_tp1": two / one}))


if __name__ == "__main__":
    main()
