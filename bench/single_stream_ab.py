"""One stream's decode, A/B in one process: ms per output token, uninstrumented.

    PYTHONPATH=$PWD python -m bench.single_stream_ab --model M [--cpu-threads 1]
        [--pairs 5] [--output-len 256] [--variants modules,plan]

One request (a 32-token prompt, `--output-len` greedy tokens, EOS ignored)
through the offline `LLM`, per variant in interleaved order (A B B A ...), so a
loaded machine's drift falls on both alike. Each run's figure is thread CPU time
of the engine's thread per output token (with `--cpu-threads 1` that is all the
step's compute; the figure a shared machine barely moves) and wall time per
token beside it. Prints the best and the median of each variant, and checks that
every variant produced the same tokens.

Variants (each sets the engine to one state; see VARIANTS):
    modules   the decoder layers through their module forwards
    plan      the layers' kernels bound once (worker/models/decode_plan.py)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench.workloads import FIRST_TOKEN_ID


def _set_plan(llm, on: bool) -> None:
    from worker.models.decode_plan import build_decode_plan

    model = llm.engine.core.runner.model.model
    model.decode_plan = build_decode_plan(model) if on else None


VARIANTS = {
    "modules": lambda llm: _set_plan(llm, False),
    "plan": lambda llm: _set_plan(llm, True),
}


def run_once(llm, output_len: int) -> tuple[float, float, list[int]]:
    from worker import SamplingParams

    prompt = [FIRST_TOKEN_ID + (i * 7919) % 40000 for i in range(32)]
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    cpu, wall = time.thread_time(), time.perf_counter()
    (out,) = llm.generate([prompt], params, detokenize=False)
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    tokens = list(out.outputs[0].token_ids)
    return 1000 * cpu / len(tokens), 1000 * wall / len(tokens), tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--cpu-threads", type=int, default=1)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--variants", default="modules,plan")
    args = parser.parse_args()
    from worker import LLM

    names = args.variants.split(",")
    llm = LLM(model=args.model, cpu_threads=args.cpu_threads, enable_prefix_caching=False)
    runs: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    tokens: dict[str, list[int]] = {}
    for name in names:  # warm-up: kernel builds, first-step allocations
        VARIANTS[name](llm)
        run_once(llm, 16)
    for pair in range(args.pairs):
        order = names if pair % 2 == 0 else names[::-1]
        for name in order:
            VARIANTS[name](llm)
            cpu, wall, toks = run_once(llm, args.output_len)
            runs[name].append((cpu, wall))
            tokens.setdefault(name, toks)
            assert toks == tokens[name], f"{name}: tokens changed between runs"
    load = os.getloadavg()[0]
    print(f"load average {load:.2f}, {args.cpu_threads} thread(s), {args.output_len} tokens/run")
    for name in names:
        cpu = [c for c, _ in runs[name]]
        wall = [w for _, w in runs[name]]
        print(
            f"{name:>10}: thread CPU ms/token best {min(cpu):.3f} median "
            f"{statistics.median(cpu):.3f}; wall best {min(wall):.3f} median "
            f"{statistics.median(wall):.3f}"
        )
    same = all(tokens[n] == tokens[names[0]] for n in names)
    print("tokens identical across variants:", same)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
