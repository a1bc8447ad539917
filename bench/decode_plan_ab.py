"""The decode plan against the module forwards at n decode rows, A/B in one process.

    PYTHONPATH=$PWD python -m bench.decode_plan_ab --model M [--rows 16,36,64]
        [--pairs 4] [--output-len 32] [--cpu-threads 1] [--clock thread|wall]
        [--variants modules,plan]

n requests (32-token prompts, `--output-len` greedy tokens, EOS ignored) through
the offline `LLM`, so after the prefill step every step decodes n rows. Per row
count the two variants run in interleaved order (A B, then B A, ...), so a loaded
machine's drift falls on both alike. A run's figure is the model forward's thread
CPU time per n-row decode step (the decoder stack and final norm: not the LM head,
not sampling), and the same less the time inside the linear kernels (GEMV and
panel, timed through wrappers both variants call): the part the plan changes.
Prints each pair's plan/modules ratio and their median, and checks that both
variants produced the same tokens. `--clock wall` times wall clock instead (for
more than one thread: thread CPU time sees the calling thread only), a figure a
loaded machine inflates.

Variants: modules (the layers' module forwards), plan (worker/models/decode_plan.py,
its Python loop), native (the plan's kernels from one C++ call: worker/models/
decode_stack.py; its linears run past the timed wrappers, so only "forward" is
printed for a pair with it). The second variant's figure is over the first's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench.workloads import FIRST_TOKEN_ID


class StepClock:
    """Thread CPU seconds of the model forward on n-row decode-only steps, and of the
    linear kernels inside them. The kernels' module attributes are replaced by timed
    wrappers before any plan binds them, so both variants call through them."""

    def __init__(self, model, clock=time.thread_time) -> None:
        from kernels.cpu import load_cpu_kernels, load_gemv_kernels
        from worker.attention import forward_context

        self.rows, self.forward_s, self.linear_s, self.steps = 0, 0.0, 0.0, 0
        self._in_step = False
        for module, names in (
            (load_gemv_kernels(), ("gemv_bf16_linear", "gemv_bf16_linear_silu")),
            (load_cpu_kernels(), ("bf16_panel_linear", "bf16_panel_linear_silu")),
        ):
            for name in names:
                setattr(module, name, self._timed_kernel(getattr(module, name)))
        self.clock = clock
        forward = model.forward

        def timed_forward(input_ids, positions):
            metadata = forward_context._current
            if input_ids.shape[0] != self.rows or metadata.prefills:
                return forward(input_ids, positions)
            self._in_step = True
            start = self.clock()
            try:
                return forward(input_ids, positions)
            finally:
                self.forward_s += self.clock() - start
                self.steps += 1
                self._in_step = False

        model.forward = timed_forward

    def _timed_kernel(self, kernel):
        def timed(*args):
            if not self._in_step:
                return kernel(*args)
            start = self.clock()
            try:
                return kernel(*args)
            finally:
                self.linear_s += self.clock() - start

        return timed

    def reset(self, rows: int) -> None:
        self.rows, self.forward_s, self.linear_s, self.steps = rows, 0.0, 0.0, 0


def run_once(llm, clock: StepClock, rows: int, output_len: int):
    from worker import SamplingParams

    prompts = [
        [FIRST_TOKEN_ID + (i * 7919 + j * 131) % 40000 for i in range(32)] for j in range(rows)
    ]
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    clock.reset(rows)
    outputs = llm.generate(prompts, params, detokenize=False)
    steps = max(1, clock.steps)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    return 1000 * clock.forward_s / steps, 1000 * (clock.forward_s - clock.linear_s) / steps, tokens


def _set_plan(model, variant: str) -> None:
    from worker.models.decode_plan import build_decode_plan

    model.decode_plan = build_decode_plan(model) if variant != "modules" else None
    if model.decode_plan and variant != "native":
        model.decode_plan.stacks = None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--rows", default="16,36,64")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--cpu-threads", type=int, default=1)
    parser.add_argument("--clock", choices=("thread", "wall"), default="thread")
    parser.add_argument("--variants", default="modules,plan", help="two of modules, plan, native")
    args = parser.parse_args()
    from worker import LLM

    llm = LLM(model=args.model, cpu_threads=args.cpu_threads, enable_prefix_caching=False)
    model = llm.engine.core.runner.model.model
    clock = StepClock(model, time.thread_time if args.clock == "thread" else time.perf_counter)
    names = tuple(args.variants.split(","))
    assert len(names) == 2 and set(names) <= {"modules", "plan", "native"}, names
    print(
        f"{time.strftime('%H:%M:%S', time.gmtime())} UTC, load {os.getloadavg()[0]:.2f}, "
        f"{args.cpu_threads} thread(s), {args.clock} clock"
    )
    for rows in (int(r) for r in args.rows.split(",")):
        for name in names:  # warm-up: first-step allocations at this size
            _set_plan(model, name)
            run_once(llm, clock, rows, 4)
        figures = {n: [] for n in names}
        tokens = {}
        for pair in range(args.pairs):
            for name in names if pair % 2 == 0 else names[::-1]:
                _set_plan(model, name)
                step, outside, toks = run_once(llm, clock, rows, args.output_len)
                figures[name].append((step, outside))
                assert tokens.setdefault(name, toks) == toks, f"{name}: tokens changed"
        a, b = names
        same = tokens[a] == tokens[b]
        print(f"{rows} rows, load {os.getloadavg()[0]:.2f}, tokens identical: {same}")
        kinds = ("forward",) if "native" in names else ("forward", "forward - linears")
        for i, what in enumerate(kinds):
            ratios = [y[i] / x[i] for x, y in zip(figures[a], figures[b], strict=True)]
            cells = " ".join(
                f"{x[i]:.3f}/{y[i]:.3f}" for x, y in zip(*figures.values(), strict=True)
            )
            print(
                f"  {what:>17} ms/step {a}/{b} per pair: {cells}; {b}/{a} "
                f"{' '.join(f'{r:.3f}' for r in ratios)} median {statistics.median(ratios):.3f}"
            )
        if not same:
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
