"""The engine's per-step host work, with the model's compute taken out.

    PYTHONPATH=$PWD python -m bench.runner_overhead --model M [--workload decode]
        [--num-requests 32] [--repeats 3] [--cprofile 25]

Runs a workload through the offline `LLM` on one thread with the model's
forward() and compute_logits() replaced by stubs that hand back slices of fixed
tensors of the real shapes ([num_tokens, hidden_size] hidden states,
[num_sample, vocab_size] logits in the model's dtype). What is left of a step is
everything else the engine does: scheduling, the runner's bookkeeping and
inputs, sampling (argmax over real-sized logits), updating from the output, and
LLM.generate's loop. Each engine step is timed with the thread's CPU time
(time.thread_time), which other processes on a shared machine barely change, and
the step plus the loop until the next one is reported per step kind, as the
median over steps (and over `--repeats` runs of the workload).

The tokens are not the model's (the stub's logits are fixed), so the figure is
for A/B comparisons of host code: run it from two trees, interleaved.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import time


def stub_model(llm) -> None:
    """Replace the model's compute with fixed tensors of the real shapes."""
    import torch

    runner = llm.engine.core.runner
    model, spec = runner.model, runner.spec
    budget = llm.engine.config.scheduler.max_num_batched_tokens
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(budget, spec.hidden_size, generator=generator).to(runner.dtype)
    logits = torch.randn(budget, spec.vocab_size, generator=generator).to(runner.dtype)

    def forward(input_ids, positions):
        return hidden[: input_ids.shape[0]]

    def compute_logits(rows):
        return logits[: rows.shape[0]]

    model.forward = forward
    model.compute_logits = compute_logits


def stub_sampler(llm) -> None:
    """Token 0 for every row: leaves out the sampler's argmax over the vocabulary
    (memory-bound, so the most sensitive to other processes) from an A/B of the rest."""
    import torch

    from worker.sample.sampler import SamplerOutput

    def sample(logits, meta):
        return SamplerOutput(token_ids=torch.zeros(logits.shape[0], dtype=torch.int64))

    llm.engine.core.runner.sampler = sample


class StepClock:
    """Thread CPU time of each engine step and of the loop until the next one."""

    def __init__(self, llm) -> None:
        self.rows: list[tuple[str, float]] = []  # (kind, seconds from step start to next)
        self._start: float | None = None
        self._kind = ""
        self._counts: list[int] = []
        engine, scheduler = llm.engine, llm.engine.core.scheduler
        step, schedule = engine.step, scheduler.schedule

        def timed_step():
            now = time.thread_time()
            if self._start is not None:
                self.rows.append((self._kind, now - self._start))
            self._start = now
            out = step()
            self._kind = "decode" if self._counts and set(self._counts) == {1} else "other"
            return out

        def recorded_schedule():
            output = schedule()
            self._counts = list(output.num_scheduled_tokens.values())
            return output

        engine.step = timed_step
        scheduler.schedule = recorded_schedule

    def end(self) -> None:
        if self._start is not None:
            self.rows.append((self._kind, time.thread_time() - self._start))
        self._start = None


def run(llm, clock: StepClock, workload, repeats: int) -> dict:
    from worker import SamplingParams

    prompts = [list(r.prompt_token_ids) for r in workload.requests]
    params = [
        SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True)
        for r in workload.requests
    ]
    clock.rows.clear()
    for _ in range(repeats):
        llm.generate(prompts, params, detokenize=False)
        clock.end()
    decode = [s for kind, s in clock.rows if kind == "decode"]
    return {
        "decode_steps": len(decode),
        "decode_step_us_median": round(1e6 * statistics.median(decode), 1),
        "decode_step_us_mean": round(1e6 * statistics.fmean(decode), 1),
        "all_steps": len(clock.rows),
        "all_step_us_mean": round(1e6 * statistics.fmean(s for _, s in clock.rows), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--workload", default="decode")
    parser.add_argument("--num-requests", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stub-sampler", action="store_true", help="token 0, no argmax")
    parser.add_argument("--cprofile", type=int, default=0, help="print the top N functions")
    args = parser.parse_args()

    from bench.offline import warm_up
    from bench.workloads import resolve_workloads
    from shared.logging import configure_logging
    from worker import LLM

    configure_logging("WARNING")
    llm = LLM(model=args.model, cpu_threads=1)
    (workload,) = resolve_workloads(args.workload, 0, llm.engine.vocab_size, args.num_requests)
    warm_up(llm)
    stub_model(llm)
    if args.stub_sampler:
        stub_sampler(llm)
    clock = StepClock(llm)
    run(llm, clock, workload, 1)  # warm the stubbed path too
    if args.cprofile:
        profiler = cProfile.Profile(time.thread_time)
        profiler.enable()
        result = run(llm, clock, workload, args.repeats)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.cprofile)
    else:
        result = run(llm, clock, workload, args.repeats)
    print(json.dumps({"workload": workload.name, **result}))


if __name__ == "__main__":
    main()
