"""The native decode loop (worker/models/decode_stack.py, kernels/cpu/decode_stack.cpp)
computes what the plan's Python loop computes, bit for bit, on every decode-only
step it takes (a cascade's too); every other step (prefill rows) goes to the
Python loop."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import random_prompts
from tests.worker.models.test_decode_plan import (
    ENGINE,
    HALF_F32_ENGINE,
    HALF_F32_STREAMS,
    HEADS_OF_64,
    PARAMS,
    STREAMS,
    _generate,
    _needs_gemv,
)
from worker import LLM
from worker.attention import forward_context


def _plan(llm):
    model = llm.engine.core.runner.model.model
    llm.generate(random_prompts([5]), PARAMS, detokenize=False)  # builds the plan
    plan = model.decode_plan
    assert plan not in (None, False), "the plan was not built"
    assert plan.stacks is not None, "this build has no native decode loop"
    return plan


def _record(stacks, log: list) -> None:
    """Log each step the plan runs as (rows, has prefill rows, ran natively)."""
    forward = stacks.forward

    def traced(layers, hidden, positions):
        out = forward(layers, hidden, positions)
        prefills = forward_context._current.prefills
        log.append((hidden.shape[0], bool(prefills), out is not None))
        return out

    stacks.forward = traced


def _both_ways(llm, plan, batches) -> tuple[list, list, list]:
    """Each batch with the native loop, then with the plan's Python loop alone."""
    steps: list = []
    stacks = plan.stacks
    _record(stacks, steps)
    native = [_generate(llm, prompts) for prompts in batches]
    plan.stacks = None
    python = [_generate(llm, prompts) for prompts in batches]
    plan.stacks = stacks
    return native, python, steps


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: a bias on qkv_proj
def test_native_loop_matches_the_plan(make_checkpoint, arch):
    _needs_gemv()
    llm = LLM(str(make_checkpoint(arch, dtype=torch.bfloat16)), **ENGINE)
    plan = _plan(llm)
    batches = [random_prompts([3 + (7 * i + n) % 28 for i in range(n)], seed=n) for n in STREAMS]
    native, python, steps = _both_ways(llm, plan, batches)
    assert native == python
    # Every decode-only step ran natively, on the GEMV (1-6 rows) and the panel
    # kernel (8-37) alike; no step with prefill rows did.
    assert {rows for rows, prefill, ran in steps if ran} >= set(STREAMS)
    assert all(ran == (not prefill) for _, prefill, ran in steps)
    built = plan.stacks._stacks
    assert set(built) == {id(plan.layers_for(1)), id(plan.layers_for(7))}
    num_layers = len(plan.layers_for(1))
    assert all(b is not None and b[0].num_layers == num_layers for b in built.values())


@pytest.mark.parametrize(
    "arch, overrides",
    [
        ("mistral", {"sliding_window": 8}),  # the window reaches the decode kernel
        ("llama", {"num_key_value_heads": 1}),
        ("llama", {"num_key_value_heads": 4}),
    ],
    ids=["sliding-window", "mqa", "mha"],
)
def test_native_loop_matches_the_plan_on_other_shapes(make_checkpoint, arch, overrides):
    _needs_gemv()
    llm = LLM(str(make_checkpoint(arch, dtype=torch.bfloat16, **overrides)), **ENGINE)
    plan = _plan(llm)
    batches = [random_prompts([5, 19, 44, 30], seed=7), random_prompts([12], seed=8)]
    native, python, steps = _both_ways(llm, plan, batches)
    assert native == python
    assert {rows for rows, _, ran in steps if ran} >= {1, 4}


def test_a_new_binding_rebuilds_the_stacks(make_checkpoint):
    """A layer bound anew (here: its cache set again, as a new KV cache would be)
    drops the stacks; the next decode steps bind it on the plan's Python loop
    (prefill goes through the modules), then run natively on new stacks."""
    _needs_gemv()
    llm = LLM(str(make_checkpoint("llama", dtype=torch.bfloat16)), **ENGINE)
    plan = _plan(llm)
    old = dict(plan.stacks._stacks)
    attn = llm.engine.core.runner.model.model.layers[1].self_attn.attn
    attn.kv_cache = attn.kv_cache
    assert attn._bound is None
    steps: list = []
    _record(plan.stacks, steps)
    prompts = random_prompts([9, 4], seed=3)
    first = _generate(llm, prompts)
    assert any(ran for _, _, ran in steps)
    new = plan.stacks._stacks
    assert new and all(new[key] is not old.get(key) for key in new)
    plan.stacks = None
    assert first == _generate(llm, prompts)


def test_cascade_steps_run_natively(make_checkpoint, monkeypatch):
    """Ten streams behind one cached 160-token prefix: their decode steps attend it
    as a cascade inside the native loop, and produce what the plan's Python loop
    (the backend's cascade) does."""
    _needs_gemv()
    from worker.models import decode_stack

    lens: list[int] = []
    real = decode_stack.cascade_prefix_len

    def traced(metadata, block_size):
        lens.append(real(metadata, block_size))
        return lens[-1]

    monkeypatch.setattr(decode_stack, "cascade_prefix_len", traced)
    shared = random_prompts([160], seed=21)[0]
    prompts = [shared + tail for tail in random_prompts([3 + i for i in range(10)], seed=22)]
    engine = {**ENGINE, "max_model_len": 256, "enable_prefix_caching": True}
    results = []
    for native in (True, False):
        # A fresh engine each: a second run from cached blocks would prefill in other chunks.
        llm = LLM(str(make_checkpoint("llama", dtype=torch.bfloat16, **HEADS_OF_64)), **engine)
        plan = _plan(llm)
        llm.generate(prompts[:1], PARAMS, detokenize=False)  # caches the prefix
        if not native:
            plan.stacks = None
        lens.clear()
        results.append(_generate(llm, prompts))
        assert (max(lens, default=0) == 160) == native  # the whole shared prefix, natively
        llm.shutdown()
    assert results[0] == results[1]


def test_half_f32_native_loop_matches_the_plan(avx2_cpu, make_checkpoint, monkeypatch):
    """Float32 over half-stored weights (AVX2): the half GEMV (1-8 rows) and panel
    GEMM (9-128) run natively, each followed by the SiLU kernel on gate/up; above
    128 rows oneDNN's float32 copy (not one of our kernels) keeps the Python loop."""
    monkeypatch.setenv("PAGODA_CPU_HALF_WEIGHTS", "copy")  # the third route
    llm = LLM(str(make_checkpoint("qwen2", dtype=torch.bfloat16)), **HALF_F32_ENGINE)
    plan = _plan(llm)
    assert llm.engine.core.runner.model.model.layers[0].self_attn.qkv_proj.weight_f32 is not None
    batches = [
        random_prompts([3 + (7 * i + n) % 28 for i in range(n)], seed=n) for n in HALF_F32_STREAMS
    ]
    native, python, steps = _both_ways(llm, plan, batches)
    assert native == python
    decode = [(rows, ran) for rows, prefill, ran in steps if not prefill]
    assert {rows for rows, ran in decode if ran} >= {1, 8, 9, 37}
    assert all(ran == (rows <= 128) for rows, ran in decode)
    assert plan.stacks._stacks[id(plan.layers_for(129))] is None


def test_a_cascade_some_layers_cannot_take_goes_to_the_plan_loop(make_checkpoint):
    """Where only some layers' kernels take a cascade (a window on the others), a
    step with one runs on the Python loop, which decides layer by layer."""
    _needs_gemv()
    shared = random_prompts([160], seed=21)[0]
    prompts = [shared + tail for tail in random_prompts([3 + i for i in range(10)], seed=22)]
    engine = {**ENGINE, "max_model_len": 256, "enable_prefix_caching": True}
    llm = LLM(str(make_checkpoint("llama", dtype=torch.bfloat16, **HEADS_OF_64)), **engine)
    plan = _plan(llm)
    llm.generate(prompts[:1], PARAMS, detokenize=False)  # caches the prefix
    bound = llm.engine.core.runner.model.model.layers[1].self_attn.attn._bound
    bound.decode_stack_args = (*bound.decode_stack_args[:4], False)
    plan.stacks._bounds = ()  # rebuild over the changed arguments
    steps: list[tuple[bool, bool]] = []  # per decode-only step: a cascade, ran natively
    forward = plan.stacks.forward

    def traced(layers, hidden, positions):
        out = forward(layers, hidden, positions)
        metadata = forward_context._current
        if not metadata.prefills:
            steps.append((bool(metadata.cascade_blocks), out is not None))
        return out

    plan.stacks.forward = traced
    _generate(llm, prompts)
    assert (True, False) in steps and (True, True) not in steps
