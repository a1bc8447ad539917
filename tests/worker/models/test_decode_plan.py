"""The bound decode plan (worker/models/decode_plan.py) computes what the module
path computes, bit for bit: same tokens, same logprobs, on bf16 models, at the
GEMV's 1-6 rows and at the panel kernel's more."""

from __future__ import annotations

import sys

import pytest
import torch

from kernels.cpu import load_cpu_kernels, load_gemv_kernels
from tests.conftest import random_prompts
from worker import LLM, SamplingParams
from worker.attention import forward_context
from worker.layers import cpu_packed
from worker.models import decode_plan

# No prefix cache: a rerun's prefill from cached blocks rounds differently in bf16,
# plan or not.
ENGINE = dict(
    block_size=4,
    max_model_len=128,
    num_kv_blocks=1024,  # 37 streams of up to 54 tokens
    dtype="bfloat16",
    enable_prefix_caching=False,
)
PARAMS = SamplingParams(temperature=0, max_tokens=24, logprobs=3, ignore_eos=True)
# Streams per batch: 1, 4 and 6 decode on the GEMV kernels, 8, 16 and 37 on the panel one.
STREAMS = [1, 4, 6, 8, 16, 37]


def _needs_gemv() -> None:
    if cpu_packed._gemv_kernels() is None:
        pytest.skip("no bf16 GEMV kernels on this CPU/build (AVX512-BF16 panels): no plan")


def _generate(llm, prompts):
    outputs = llm.generate(prompts, PARAMS, detokenize=False)
    return [(list(o.outputs[0].token_ids), list(o.outputs[0].logprobs)) for o in outputs]


def _batches() -> list[list[list[int]]]:
    return [random_prompts([3 + (7 * i + n) % 28 for i in range(n)], seed=n) for n in STREAMS]


def _record_steps(model, log: list) -> None:
    """Log each step the model runs as (rows, has prefill rows, ran the plan)."""
    plan, model_forward, plan_forward = model.decode_plan, model.forward, model.decode_plan.forward
    ran = []

    def forward(input_ids, positions):
        ran.clear()
        out = model_forward(input_ids, positions)
        metadata = forward_context._current
        log.append((input_ids.shape[0], bool(metadata.prefills), bool(ran)))
        return out

    def traced_plan(hidden, positions):
        ran.append(True)
        return plan_forward(hidden, positions)

    model.forward, plan.forward = forward, traced_plan


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: a bias on qkv_proj
def test_plan_matches_the_module_path(make_checkpoint, arch):
    _needs_gemv()
    llm = LLM(str(make_checkpoint(arch, dtype=torch.bfloat16)), **ENGINE)
    model = llm.engine.core.runner.model.model
    llm.generate(random_prompts([5]), PARAMS, detokenize=False)  # builds the plan
    plan = model.decode_plan
    assert plan not in (None, False), "the plan was not built"
    steps: list = []
    _record_steps(model, steps)
    fused = []
    panel_layers = plan.layers_for(decode_plan.MAX_ROWS + 1)
    attend = panel_layers[0].attend_qkv

    def traced_attend(qkv, positions):
        fused.append(attend(qkv, positions))
        return fused[-1]

    panel_layers[0].attend_qkv = traced_attend
    with_plan = [_generate(llm, prompts) for prompts in _batches()]
    # Every decode-only step ran the plan, at every batch size; the others did not
    # (above 6 rows), and the fused attention ran on the panel rows.
    decode_rows = {rows for rows, prefill, ran in steps if not prefill and ran}
    assert decode_rows >= set(STREAMS)
    assert all(ran == (rows <= decode_plan.MAX_ROWS or not prefill) for rows, prefill, ran in steps)
    assert fused and all(out is not None for out in fused)
    assert panel_layers[0].qkv is not plan.layers_for(1)[0].qkv
    # The plan's unfused attention (a layer whose bound attention has no fused
    # path takes it) at panel rows too.
    for layer in panel_layers:
        layer.attend_qkv = lambda qkv, positions: None
    unfused = [_generate(llm, prompts) for prompts in _batches()]
    model.decode_plan = None  # the module path from now on
    without = [_generate(llm, prompts) for prompts in _batches()]
    assert with_plan == without
    assert unfused == without


def test_mixed_steps_keep_the_module_path(make_checkpoint):
    """Chunked prefill: steps of prompt chunks beside decode rows, above 6 rows, go
    through the module forwards; the decode-only steps between them, the plan."""
    _needs_gemv()
    engine = {**ENGINE, "max_num_batched_tokens": 24}
    llm = LLM(str(make_checkpoint("llama", dtype=torch.bfloat16)), **engine)
    model = llm.engine.core.runner.model.model
    prompts = random_prompts([20, 9, 31, 14, 26, 11, 17, 23, 5, 29, 8, 19], seed=12)
    llm.generate(prompts[:1], PARAMS, detokenize=False)  # builds the plan
    steps: list = []
    _record_steps(model, steps)
    with_plan = _generate(llm, prompts)
    mixed = [(rows, ran) for rows, prefill, ran in steps if prefill and rows > decode_plan.MAX_ROWS]
    assert mixed and not any(ran for _, ran in mixed)
    assert any(ran and rows > 8 for rows, prefill, ran in steps if not prefill)
    model.decode_plan = None
    assert with_plan == _generate(llm, prompts)


def _recorded(name: str, kernel, calls: list):
    def call(*args):
        calls.append(name)
        return kernel(*args)

    return call


def test_plan_binds_the_kernels_cpu_packed_routes_to(make_checkpoint, monkeypatch):
    """Row for row, the plan's linears call the kernel packed_linear(_silu) would."""
    _needs_gemv()
    llm = LLM(str(make_checkpoint("qwen2", dtype=torch.bfloat16)), **ENGINE)
    model = llm.engine.core.runner.model.model
    calls: list[str] = []
    gemv, panel = load_gemv_kernels(), load_cpu_kernels()
    for module, name in (
        (gemv, "gemv_bf16_linear"),
        (gemv, "gemv_bf16_linear_silu"),
        (panel, "bf16_panel_linear"),
        (panel, "bf16_panel_linear_silu"),
    ):
        monkeypatch.setattr(module, name, _recorded(name, getattr(module, name), calls))
    plan = decode_plan.build_decode_plan(model)  # binds the recorders
    qkv, gate_up = model.layers[0].self_attn.qkv_proj, model.layers[0].mlp.gate_up_proj
    generator = torch.Generator().manual_seed(0)
    for rows in (1, 6, 7, 16, 37, 256):
        x = torch.randn(rows, qkv.input_size, generator=generator).to(torch.bfloat16)
        calls.clear()
        module_out = (
            cpu_packed.packed_linear(x, qkv.weight, qkv.bias),
            cpu_packed.packed_linear_silu(x, gate_up.weight, gate_up.bias),
        )
        module_calls = list(calls)
        calls.clear()
        layer = plan.layers_for(rows)[0]
        plan_out = (layer.qkv(x), layer.gate_up_silu(x))
        prefix = "gemv_bf16" if rows <= cpu_packed.GEMV_MAX_ROWS else "bf16_panel"
        assert module_calls == [f"{prefix}_linear", f"{prefix}_linear_silu"], rows
        assert calls == module_calls, rows
        assert all(torch.equal(a, b) for a, b in zip(plan_out, module_out, strict=True)), rows


def test_step_profile_categorizes_every_plan_call():
    from bench.step_profile import _PLAN_CATEGORIES

    # `attn` is the Attention module: the profile wraps its forward as a module's.
    assert set(decode_plan.LayerPlan.__slots__) == {*_PLAN_CATEGORIES, "attn"}


def test_no_plan_for_q_k_norm(make_checkpoint):
    _needs_gemv()
    llm = LLM(str(make_checkpoint("qwen3", dtype=torch.bfloat16)), **ENGINE)
    llm.generate(random_prompts([6], seed=5), PARAMS, detokenize=False)
    assert llm.engine.core.runner.model.model.decode_plan is None


def test_no_plan_for_float32(make_checkpoint):
    llm = LLM(str(make_checkpoint("llama")), **{**ENGINE, "dtype": "float32"})
    llm.generate(random_prompts([6], seed=5), PARAMS, detokenize=False)
    assert llm.engine.core.runner.model.model.decode_plan is None


# Float32 compute over half-stored weights (an AVX2-only CPU, emulated by avx2_cpu):
# 1-8 streams on the half GEMV, 9-128 on the half panel GEMM, more on oneDNN's copy.
HALF_F32_ENGINE = {**ENGINE, "dtype": "float32", "num_kv_blocks": 2048}
HALF_F32_STREAMS = [1, 8, 9, 37, 130]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: a bias on qkv_proj
def test_half_f32_plan_matches_the_module_path(avx2_cpu, make_checkpoint, arch):
    llm = LLM(str(make_checkpoint(arch, dtype=torch.bfloat16)), **HALF_F32_ENGINE)
    model = llm.engine.core.runner.model.model
    llm.generate(random_prompts([5]), PARAMS, detokenize=False)  # builds the plan
    plan = model.decode_plan
    assert plan not in (None, False), "the plan was not built"
    assert plan.row_limits[:2] == [8, 128] and plan.max_rows == 8
    steps: list = []
    _record_steps(model, steps)
    batches = [
        random_prompts([3 + (7 * i + n) % 28 for i in range(n)], seed=n) for n in HALF_F32_STREAMS
    ]
    with_plan = [_generate(llm, prompts) for prompts in batches]
    decode_rows = {rows for rows, prefill, ran in steps if not prefill and ran}
    assert decode_rows >= set(HALF_F32_STREAMS)
    assert all(ran == (rows <= 8 or not prefill) for rows, prefill, ran in steps)
    model.decode_plan = None  # the module path from now on
    assert with_plan == [_generate(llm, prompts) for prompts in batches]


def test_half_f32_plan_binds_the_kernels_half_linear_routes_to(
    avx2_cpu, make_checkpoint, monkeypatch
):
    """Row for row, the plan's linears give what half_linear gives, through the same
    kernel (GEMV, panel GEMM, oneDNN's float32 copy), and the gate/up SiLU is fused
    into the panel GEMM where the module path fuses it (half_linear_silu), else
    the activation kernel's."""
    from worker.layers import cpu_half_f32
    from worker.layers.activation import SiluAndMul

    monkeypatch.setenv("PAGODA_CPU_HALF_WEIGHTS", "copy")  # the third route (not the default)
    llm = LLM(str(make_checkpoint("qwen2", dtype=torch.bfloat16)), **HALF_F32_ENGINE)
    model = llm.engine.core.runner.model.model
    copies: list[int] = []
    packed_linear = cpu_packed.packed_linear

    def spy(x, weight, bias):
        copies.append(x.shape[0])
        return packed_linear(x, weight, bias)

    monkeypatch.setattr(cpu_packed, "packed_linear", spy)
    plan = decode_plan.build_decode_plan(model)  # binds the spy
    qkv, gate_up = model.layers[0].self_attn.qkv_proj, model.layers[0].mlp.gate_up_proj
    assert qkv.weight_is_half_f32 and qkv.weight_f32 is not None
    generator = torch.Generator().manual_seed(0)
    for rows in (1, 8, 9, 128, 129, 300):
        x = torch.randn(rows, qkv.input_size, generator=generator)
        copies.clear()
        fused = cpu_half_f32.half_linear_silu(x, gate_up.weight, None, gate_up.weight_f32)
        assert (fused is not None) == (9 <= rows <= 128), rows
        if fused is None:
            fused = SiluAndMul()(
                cpu_half_f32.half_linear(x, gate_up.weight, None, gate_up.weight_f32)
            )
        module_out = (cpu_half_f32.half_linear(x, qkv.weight, qkv.bias, qkv.weight_f32), fused)
        module_copies = list(copies)
        copies.clear()
        layer = plan.layers_for(rows)[0]
        plan_out = (layer.qkv(x), layer.gate_up_silu(x))
        native = getattr(layer.gate_up_silu, "native", None)
        if 9 <= rows <= 128:  # the fused kernel's entry, no SiLU after it
            gemm = cpu_half_f32.load_half_f32_kernels()
            assert native[0] is gemm.half_panel_linear_silu_fn and native[3] is False, rows
        assert module_copies == ([rows, rows] if rows > 128 else []), rows
        assert copies == module_copies, rows
        assert all(torch.equal(a, b) for a, b in zip(plan_out, module_out, strict=True)), rows


# The bf16 cascade runs the prefill tiles, which take heads of 64 dims.
HEADS_OF_64 = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2)


def test_cascade_steps_take_the_fused_attention(make_checkpoint, monkeypatch):
    """Ten streams behind one cached 160-token prefix: their decode steps attend the
    prefix as a cascade inside the plan's fused RoPE + cache write + attention
    (cpu_bound's decode_qkv), and produce what the module path (rotary module, then
    the backend's cascade) does."""
    _needs_gemv()
    from worker.attention.backends.cpu import CPUAttentionBackend

    taken: list[tuple[int, bool]] = []  # (cascade prefix length, called from decode_qkv)
    cascade_len = CPUAttentionBackend._cascade_prefix_len

    def traced_len(self, *args):
        frame, fused = sys._getframe(1), False
        while frame is not None and not fused:
            fused, frame = frame.f_code.co_name == "decode_qkv", frame.f_back
        taken.append((cascade_len(self, *args), fused))
        return taken[-1][0]

    monkeypatch.setattr(CPUAttentionBackend, "_cascade_prefix_len", traced_len)
    shared, tails = (
        random_prompts([160], seed=21)[0],
        random_prompts([3 + i for i in range(10)], seed=22),
    )
    prompts = [shared + tail for tail in tails]
    engine = {**ENGINE, "max_model_len": 256, "enable_prefix_caching": True}
    results = []
    for use_plan in (True, False):
        # A fresh engine each: a second run from cached blocks would prefill in other chunks.
        llm = LLM(str(make_checkpoint("llama", dtype=torch.bfloat16, **HEADS_OF_64)), **engine)
        model = llm.engine.core.runner.model.model
        llm.generate(prompts[:1], PARAMS, detokenize=False)  # builds the plan; caches the prefix
        assert model.decode_plan not in (None, False), "the plan was not built"
        model.decode_plan.stacks = None  # the plan's Python loop (test_decode_stack: native)
        if not use_plan:
            model.decode_plan = None
        taken.clear()
        results.append(_generate(llm, prompts))
        cascades = [fused for length, fused in taken if length >= 160]
        assert cascades, "no step attended the shared prefix as a cascade"
        assert all(fused == use_plan for fused in cascades)
        llm.shutdown()
    assert results[0] == results[1]
