"""`pagoda bench profile`: where an engine step's time goes, in-process.

    pagoda bench profile --model M --workload mixed [--max-num-batched-tokens 4096]
        [--num-requests N] [--torch-profiler 8] [--output profile.jsonl]

Runs the workload through our offline `LLM` (greedy, EOS ignored, after the same
warm-up as `pagoda bench offline`) with timers wrapped around the engine's parts
(bench/step_attribution.py: exclusive time, so the rows add up to the step):

    linear: <role>         each linear module by its name in the layer (qkv_proj,
                           o_proj, gate_up_proj with its fused SiLU, down_proj)
    linear: lm_head        the model's compute_logits (only the sampled rows)
    attention              the Attention modules (KV write + the kernels)
    norms / rotary / activation   RMSNorm, RoPE, SiluAndMul where not fused
    forward glue           the rest of the forward: embedding lookup, splits,
                           residual adds, module-call overhead
    sampling               the runner's sampler
    host syncs             Tensor.tolist / .item (device -> Python values)
    step inputs            building the step's arrays, sampling metadata,
                           staging them, attention metadata
    runner (other)         the rest of execute_model (request state updates ...)
    scheduler: schedule / update    the scheduler's two calls per step
    engine (other)         the rest of the engine's step (stats, events, deltas)
    offline loop           LLM.generate's own work between two steps

Steps are grouped by kind (bench/step_attribution.py's `step_kind`). A part the
code no longer has is simply not wrapped (its time lands in its caller's row);
`wrapped` in the JSON line lists what was. `--torch-profiler N` also prints
torch.profiler's top operators by self CPU time over the first N requests (aten
operators only: our C++ kernels, called through pybind, are not in it). The machine
is usually shared: `--clock wall` (the default) times wall clock with the engine's
threads, the figure a quiet machine gives; on a loaded one the ms are inflated and
OpenMP waits for descheduled threads smear time into every row. `--clock thread`
runs the engine on one thread (`--cpu-threads 1`) and times that thread's CPU
time (time.thread_time), which other processes on the cores barely change.
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import ExitStack

from bench.machine import describe_machine
from bench.profile_table import profile_table
from bench.step_attribution import BETWEEN_STEPS, Attribution, StepLog, step_kind, summarize_steps

LINEAR_ROLES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "q_proj", "k_proj", "v_proj")
LINEAR_ROLES += ("gate_proj", "up_proj")
CATEGORIES = [
    *(f"linear: {r}" for r in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")),
    "attention",
    "norms",
    "rotary",
    "activation",
    "forward glue",
    "sampling",
    "host syncs",
    "step inputs",
    "runner (other)",
    "scheduler: schedule",
    "scheduler: update",
    "engine (other)",
    BETWEEN_STEPS,
]


def _module_category(name: str, module) -> str:
    from worker.layers.activation import SiluAndMul
    from worker.layers.attention import Attention
    from worker.layers.layernorm import RMSNorm
    from worker.layers.rotary import RotaryEmbedding

    role = name.rsplit(".", 1)[-1]
    if role in LINEAR_ROLES:
        return f"linear: {role}"
    for cls, category in (
        (Attention, "attention"),
        (RMSNorm, "norms"),
        (RotaryEmbedding, "rotary"),
        (SiluAndMul, "activation"),
    ):
        if isinstance(module, cls):
            return category
    return "forward glue"


def _patch(stack: ExitStack, owner, attr: str, attribution: Attribution, category: str, log):
    """Replace owner.attr with its timed self (undone when `stack` closes)."""
    original = getattr(owner, attr, None)
    if original is None:
        return
    had_own = attr in getattr(owner, "__dict__", {})
    setattr(owner, attr, attribution.wrap(original, category))
    log.append(f"{getattr(owner, '__name__', type(owner).__name__)}.{attr}")
    if had_own:
        stack.callback(setattr, owner, attr, original)
    else:
        stack.callback(delattr, owner, attr)


def instrument(llm, attribution: Attribution, steps: StepLog, stack: ExitStack) -> list[str]:
    """Wrap the engine's parts; returns what was wrapped."""
    import torch

    import worker.runner.model_runner as runner_module

    wrapped: list[str] = []
    engine, core = llm.engine, llm.engine.core
    runner = core.runner
    model = runner.model
    for name, module in model.named_modules():
        category = _module_category(name, module) if name else "forward glue"
        _patch(stack, module, "forward", attribution, category, [])
        if category.startswith("linear") and hasattr(module, "silu_and_mul"):
            _patch(stack, module, "silu_and_mul", attribution, category, [])
    wrapped.append(f"{sum(1 for _ in model.modules())} model modules")
    _instrument_decode_plan(getattr(model, "model", None), attribution, stack, wrapped)
    _patch(stack, model, "compute_logits", attribution, "linear: lm_head", wrapped)
    _patch(stack, runner, "sampler", attribution, "sampling", wrapped)
    for attr in ("build_step_inputs", "build_sampling_metadata"):
        _patch(stack, runner_module, attr, attribution, "step inputs", wrapped)
    _patch(stack, runner.staging, "upload", attribution, "step inputs", wrapped)
    _patch(stack, runner.backend, "build_metadata", attribution, "step inputs", wrapped)
    _patch(stack, runner, "execute_model", attribution, "runner (other)", wrapped)
    for attr in ("tolist", "item"):
        _patch(stack, torch.Tensor, attr, attribution, "host syncs", wrapped)
    scheduler = core.scheduler
    schedule = scheduler.schedule

    def schedule_and_classify(*args, **kwargs):
        output = schedule(*args, **kwargs)
        steps.set_kind(step_kind(list(output.num_scheduled_tokens.values())))
        return output

    scheduler.schedule = attribution.wrap(schedule_and_classify, "scheduler: schedule")
    stack.callback(delattr, scheduler, "schedule")
    wrapped.append("scheduler.schedule")
    _patch(stack, scheduler, "update_from_output", attribution, "scheduler: update", wrapped)
    _patch(stack, core, "step", attribution, "engine (other)", wrapped)
    step = engine.step

    def logged_step(*args, **kwargs):
        steps.begin("empty")
        try:
            return step(*args, **kwargs)
        finally:
            steps.end()

    engine.step = attribution.wrap(logged_step, "engine (other)")
    stack.callback(delattr, engine, "step")
    wrapped.append("engine.step")
    return wrapped


# A decode plan's bound calls (worker/models/decode_plan.py) and their categories;
# its attention is the Attention module, whose forward is wrapped above.
_PLAN_CATEGORIES = {
    "in_norm": "norms",
    "post_norm": "norms",
    "qkv": "linear: qkv_proj",
    "o": "linear: o_proj",
    "gate_up_silu": "linear: gate_up_proj",
    "down": "linear: down_proj",
    "rotary": "rotary",
    "attend_qkv": "attention",  # RoPE + cache write + decode kernel, fused: rotary is in it
}


def _instrument_decode_plan(decoder, attribution: Attribution, stack: ExitStack, wrapped) -> None:
    """Steps the plan runs (decode steps, any step up to the GEMV's rows) bypass the
    module forwards: wrap the plan's calls instead, in each of its layer lists (one
    per linear kernel; the lists share their other calls, each wrapped in each).
    The native decode loop (worker/models/decode_stack.py) is off while profiling:
    its kernels run in one C++ call that no Python timer can split, so decode steps
    take the plan's Python loop, its twin, and "forward glue" is that loop's cost
    (about 0.8 ms a one-row step more than the native loop's on a Zen 4)."""
    plan = getattr(decoder, "decode_plan", None)
    if not plan:  # None or False (not built: warm_up decodes, so it would be)
        return
    if plan.stacks is not None:
        stack.callback(setattr, plan, "stacks", plan.stacks)
        plan.stacks = None
        wrapped.append("decode plan's Python loop (the native loop off)")
    for layer in [layer for layers in plan.layer_lists for layer in layers]:  # __slots__: setattr
        for attr, category in _PLAN_CATEGORIES.items():
            original = getattr(layer, attr)
            setattr(layer, attr, attribution.wrap(original, category))
            stack.callback(setattr, layer, attr, original)
    original = plan.final_norm
    plan.final_norm = attribution.wrap(original, "norms")
    stack.callback(setattr, plan, "final_norm", original)
    wrapped.append(f"decode plan ({len(plan.layer_lists[0])} layers)")


def timer_overhead_s(clock=time.perf_counter, n: int = 20000) -> float:
    """Seconds one timed call adds over a plain call (measured here, now)."""
    attribution = Attribution(clock)

    def noop() -> None:
        return None

    timed = attribution.wrap(noop, "x")
    start = clock()  # the profile's own clock: thread CPU time ignores preemption
    for _ in range(n):
        noop()
    plain = clock() - start
    start = clock()
    for _ in range(n):
        timed()
    return max(0.0, (clock() - start - plain) / n)


def _torch_profile(llm, workload, num_requests: int) -> str:
    """torch.profiler's operator table over the workload's first `num_requests`."""
    from torch.profiler import ProfilerActivity, profile

    from bench.offline import run_offline

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run_offline(llm, workload.head(num_requests), model="")
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)


def main(args: argparse.Namespace) -> int:
    from bench.offline import run_offline, warm_up
    from bench.workloads import resolve_workloads
    from worker import LLM
    from worker.config import EngineConfig

    if args.clock == "thread":
        args.cpu_threads = 1  # thread CPU time sees the calling thread only
    config = EngineConfig.from_cli_args(args)
    llm = LLM(config=config)
    (workload,) = resolve_workloads(
        args.workload, args.seed, llm.engine.vocab_size, args.num_requests
    )
    warm_up(llm)
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    attribution = Attribution(clock)
    steps = StepLog(attribution)
    with ExitStack() as stack:
        wrapped = instrument(llm, attribution, steps, stack)
        result = run_offline(llm, workload, model=config.model.model)
    summary = summarize_steps(steps.steps, CATEGORIES)
    calls_per_step = sum(attribution.calls.values()) / max(1, len(steps.steps))
    record = {
        "kind": "step_profile",
        "workload": workload.name,
        "model": config.model.model,
        "dtype": result.dtype,
        "elapsed_s": round(result.elapsed_s, 3),
        "total_tokens_per_s": round(result.total_tokens_per_s, 2),
        "steps": summary,
        "timed_calls_per_step": round(calls_per_step, 1),
        "timer_overhead_ms_per_step": round(1000 * calls_per_step * timer_overhead_s(clock), 3),
        "clock": args.clock,
        "cpu_threads": config.device.cpu_threads,
        "wrapped": wrapped,
        "flags": result.flags,
        "machine": describe_machine(),
    }
    if args.output:
        with open(args.output, "a") as f:  # stdout carries the table
            f.write(json.dumps(record) + "\n")
    print("\n".join(profile_table(record)))
    if args.torch_profiler:
        print(_torch_profile(llm, workload, args.torch_profiler))
    return 0
