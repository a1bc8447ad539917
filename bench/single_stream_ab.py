"""One stream's decode, A/B in one process: ms per output token, uninstrumented.

    PYTHONPATH=$PWD python -m bench.single_stream_ab --model M [--cpu-threads 1]
        [--pairs 5] [--output-len 256] [--variants modules,plan]

One request (a 32-token prompt, `--output-len` greedy tokens, EOS ignored)
through the offline `LLM`, per variant in interleaved order (A B B A ...), so a
loaded machine's drift falls on both alike. Each run's figure is thread CPU time
of the engine's thread per output token (with `--cpu-threads 1` that is all the
step's compute; the figure a shared machine barely moves) and wall time per
token beside it. Prints the best and the median of each variant, and checks that
every variant produced the same tokens. The GEMV kernels are timed inside
each run (GemvClock), so each run also gives the step's time outside them,
step minus GEMV: everything that is not weight streaming, the figure a loaded
machine's memory contention barely moves (the GEMVs it moves a lot). Last, one
pass of every linear and the LM head on one row alone (best of 20).

Variants (each sets the engine to one state; see VARIANTS):
    modules   the decoder layers through their module forwards
    plan-unfused  the plan with RoPE, cache write and attention as separate calls
    plan      the layers' kernels bound once (worker/models/decode_plan.py), RoPE +
              cache write fused (rope_write_kv) before the decode kernel, called
              from the plan's Python loop
    native    the same kernels from one C++ call a step (worker/models/decode_stack.py),
              the engine's default
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench.workloads import FIRST_TOKEN_ID


def _set_plan(llm, on: bool, fused_attention: bool = True, native: bool = False) -> None:
    from worker.models.decode_plan import build_decode_plan

    model = llm.engine.core.runner.model.model
    model.decode_plan = build_decode_plan(model) if on else None
    if model.decode_plan and not fused_attention:
        for layer in model.decode_plan.layers_for(1):
            layer.attend_qkv = lambda qkv, positions: None  # rotary + attention module
    if model.decode_plan and not native:
        model.decode_plan.stacks = None


VARIANTS = {
    "modules": lambda llm: _set_plan(llm, False),
    "plan-unfused": lambda llm: _set_plan(llm, True, fused_attention=False),
    "plan": lambda llm: _set_plan(llm, True),
    "native": lambda llm: _set_plan(llm, True, native=True),
}


class GemvClock:
    """Thread CPU seconds inside the GEMV kernels (every linear and the LM head of
    a 1-4 row step), accumulated: the module attributes are replaced by timed
    wrappers before any plan binds them, so both paths call through them."""

    def __init__(self) -> None:
        from kernels.cpu import load_gemv_f32_kernels, load_gemv_kernels

        self.seconds = 0.0
        module = load_gemv_kernels()
        for name in ("gemv_bf16_linear", "gemv_bf16_linear_silu"):
            setattr(module, name, self._timed(getattr(module, name)))
        half = load_gemv_f32_kernels()  # float32 over half weights (CPUs without fast bf16)
        if half is not None:
            half.gemv_half_f32_linear = self._timed(half.gemv_half_f32_linear)

    def _timed(self, kernel):
        clock = time.thread_time

        def timed(*args):
            start = clock()
            try:
                return kernel(*args)
            finally:
                self.seconds += clock() - start

        return timed


def run_once(llm, output_len: int) -> tuple[float, float, list[int]]:
    from worker import SamplingParams

    prompt = [FIRST_TOKEN_ID + (i * 7919) % 40000 for i in range(32)]
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    cpu, wall = time.thread_time(), time.perf_counter()
    (out,) = llm.generate([prompt], params, detokenize=False)
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    tokens = list(out.outputs[0].token_ids)
    return 1000 * cpu / len(tokens), 1000 * wall / len(tokens), tokens


def gemv_pass_ms(llm, passes: int = 20) -> float:
    """Thread CPU ms of one row through every linear of the model, best of `passes`."""
    import torch

    from worker.models.decode_plan import build_decode_plan

    model = llm.engine.core.runner.model
    plan = build_decode_plan(model.model)
    if plan is None:
        return float("nan")
    spec = model.spec
    first = model.model.layers[0]
    dtype = model.model.norm.weight.dtype  # bf16, or float32 over half weights
    x = torch.randn(1, spec.hidden_size, dtype=dtype)
    xo = torch.randn(1, first.self_attn.o_proj.input_size, dtype=dtype)
    xd = torch.randn(1, first.mlp.down_proj.input_size, dtype=dtype)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(passes):
            start = time.thread_time()
            for layer in plan.layers_for(1):
                layer.qkv(x)
                layer.o(xo)
                layer.gate_up_silu(x)
                layer.down(xd)
            model.compute_logits(x)
            best = min(best, time.thread_time() - start)
    return 1000 * best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--cpu-threads", type=int, default=1)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--variants", default="modules,plan-unfused,plan,native")
    args = parser.parse_args()
    from worker import LLM

    names = args.variants.split(",")
    llm = LLM(model=args.model, cpu_threads=args.cpu_threads, enable_prefix_caching=False)
    gemv = GemvClock()
    runs: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    remainders: dict[str, list[float]] = {n: [] for n in names}
    tokens: dict[str, list[int]] = {}
    for name in names:  # warm-up: kernel builds, first-step allocations
        VARIANTS[name](llm)
        run_once(llm, 16)
    for pair in range(args.pairs):
        order = names if pair % 2 == 0 else names[::-1]
        for name in order:
            VARIANTS[name](llm)
            gemv.seconds = 0.0
            cpu, wall, toks = run_once(llm, args.output_len)
            runs[name].append((cpu, wall))
            remainders[name].append(cpu - 1000 * gemv.seconds / len(toks))
            tokens.setdefault(name, toks)
            assert toks == tokens[name], f"{name}: tokens changed between runs"
    load = os.getloadavg()[0]
    print(f"load average {load:.2f}, {args.cpu_threads} thread(s), {args.output_len} tokens/run")
    for name in names:
        cpu = [c for c, _ in runs[name]]
        wall = [w for _, w in runs[name]]
        print(
            f"{name:>12}: thread CPU ms/token best {min(cpu):.3f} median "
            f"{statistics.median(cpu):.3f}; wall best {min(wall):.3f} median "
            f"{statistics.median(wall):.3f}"
        )
    for name in names:
        if name == "native":  # its GEMVs are called from C++, past GemvClock's wrappers
            continue
        rest = remainders[name]
        print(
            f"{name:>12}: outside the GEMV kernels (step - GEMV, thread CPU) ms/token best "
            f"{min(rest):.3f} median {statistics.median(rest):.3f}"
        )
    print(f"GEMV alone (all linears + LM head, one row, a pass): {gemv_pass_ms(llm):.3f} ms")
    same = all(tokens[n] == tokens[names[0]] for n in names)
    print("tokens identical across variants:", same)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
