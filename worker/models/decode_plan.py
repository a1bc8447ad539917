"""A decoder stack's kernels bound once, for decode steps of any size.

A one-row decode step of a 30-layer model spends about as long in Python
between its kernels as in the weight-streaming GEMVs themselves: each layer
goes through ~8 module forwards, the quant method, the packed-linear router
(row count, layout and kernel checks) and the elementwise dispatch, ~35 us of
thread time per layer that decides the same thing every step. Here those
decisions are taken once per model: each layer becomes a `LayerPlan` of
closures over the very kernels and arguments the module path would call, and
`DecodePlan.forward` runs them in a flat loop. Each layer is bound once per
kernel its linears route a step's rows to, and the step picks one list: bf16
panels (AVX512-BF16) over the GEMV kernels (1-6 rows) and the panel kernel
(more), as cpu_packed routes them; float32 compute over half-stored weights
(AVX2, worker/layers/cpu_half_f32.py) over its GEMV (1-8 rows), its panel GEMM
(9-128) and oneDNN's float32 copy (more), as half_linear routes them. On a
decode-only step RoPE, the KV-cache write and the decode kernel go in one fused
call from the QKV rows (rope_write_kv, kernels/cpu/elementwise.cpp; then the
decode kernel), without the split, the views and the attention module. The
kernels, their arguments and their order are those of the module path, so the
results are bit for bit the same (tests/worker/models/test_decode_plan.py); the
module path stays the twin.

The model runs the plan for steps of up to the GEMV's rows of any kind (a step
with prefill rows takes the split, the rotary kernel and the attention module in
the plan's loop) and for decode-only steps of any size (`covers`); a larger step
with prefill rows keeps the module path. A decode-only step goes further:
`stacks` runs the same bound kernels from one C++ call (decode_stack.py), and
this loop is its twin.

`build_decode_plan` returns None (the model keeps its module path) unless every
layer is the plain shape this covers: one rank, no q/k norm, unquantized
weights in one of the two formats above with their kernels, the fused norm and
RoPE kernels, no bias on o_proj and down_proj (RowParallelLinear adds theirs
after the sum).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from worker.attention import forward_context
from worker.models.decode_stack import NativeStacks, native_stacks
from worker.models.plan_routes import MAX_ROWS as MAX_ROWS  # the GEMV's rows, for callers
from worker.models.plan_routes import (
    bf16_routes,
    half_f32_routes,
    is_bf16_panel_linear,
    is_half_f32_linear,
)


class LayerPlan:
    """One decoder layer's calls. Attributes, not a tuple, so that bench/step_profile.py
    can wrap each with its category."""

    __slots__ = (
        "attend_qkv",
        "attn",
        "down",
        "gate_up_silu",
        "in_norm",
        "o",
        "post_norm",
        "qkv",
        "rotary",
    )

    def __init__(self, **calls: Callable) -> None:
        for name, call in calls.items():
            setattr(self, name, call)


class DecodePlan:
    def __init__(
        self,
        row_limits: list[int],
        layer_lists: list[list[LayerPlan]],
        sizes: list[int],
        final_norm: Callable,
    ) -> None:
        # layer_lists[i] binds the kernels steps of up to row_limits[i] rows take (and
        # more than row_limits[i - 1]); the last list takes any larger step.
        self.row_limits = row_limits
        self.layer_lists = layer_lists
        self.max_rows = row_limits[0]  # a step of any kind up to here (the GEMV's rows)
        self.sizes = sizes  # [q_size, kv_size, kv_size]
        self.final_norm = final_norm
        # The decode-only steps' native loop (worker/models/decode_stack.py), or None:
        # every step in the Python loop below, its twin.
        self.stacks: NativeStacks | None = None

    def covers(self, num_rows: int) -> bool:
        """Whether a step of num_rows rows runs here: 1-max_rows rows of any kind,
        more only where every row decodes (no prefill rows in the step's metadata)."""
        if num_rows <= self.max_rows:
            return True
        # Backends without the decode/prefill partition keep the module path.
        prefills = getattr(forward_context._current, "prefills", None)
        return prefills is not None and not prefills

    def layers_for(self, num_rows: int) -> list[LayerPlan]:
        """The layers on the kernels num_rows rows route to (GEMV, panel, copy):
        decided once per step, not per linear."""
        for limit, layers in zip(self.row_limits, self.layer_lists, strict=True):
            if num_rows <= limit:
                return layers
        return self.layer_lists[-1]

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """hidden: the embedded rows [tokens, hidden] -> the final norm's output."""
        layers = self.layers_for(hidden.shape[0])
        if self.stacks is not None:
            out = self.stacks.forward(layers, hidden, positions)
            if out is not None:
                return out
        sizes = self.sizes
        residual = None
        for layer in layers:
            if residual is None:  # the first layer: the embedding is the residual
                residual = hidden
                hidden = layer.in_norm(hidden, None)
            else:
                hidden = layer.in_norm(hidden, residual)
            qkv = layer.qkv(hidden)
            out = layer.attend_qkv(qkv, positions)  # a decode-only step: one fused call
            if out is None:
                q, k, v = qkv.split_with_sizes(sizes, dim=-1)
                layer.rotary(positions, q, k)  # in place
                out = layer.attn.forward(q, k, v)
            hidden = layer.o(out)
            hidden = layer.post_norm(hidden, residual)
            hidden = layer.down(layer.gate_up_silu(hidden))
        return self.final_norm(hidden, residual)


def build_decode_plan(model) -> DecodePlan | None:
    """model: a LlamaModel (worker/models/llama.py) after loading; None where the plan
    does not cover it."""
    from kernels.cpu import fused_elementwise_kernels

    layers = list(model.layers)
    weight = model.norm.weight
    if not layers or not weight.is_cpu or model.embed_tokens.tp_size != 1:
        return None
    if weight.dtype == torch.bfloat16:
        is_linear, routes = is_bf16_panel_linear, bf16_routes
    elif weight.dtype == torch.float32:
        is_linear, routes = is_half_f32_linear, half_f32_routes
    else:
        return None
    if not all(is_linear(layer.self_attn.qkv_proj) for layer in layers):
        return None  # before asking for the GEMV kernels: they build on first ask
    elementwise = fused_elementwise_kernels(weight)
    bound = routes(elementwise) if elementwise is not None else None
    if bound is None:
        return None
    row_limits = [limit for limit, _, _ in bound]
    layer_lists: list[list[LayerPlan]] = [[] for _ in bound]
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        if attn.qk_norm or not all(is_linear(lin) for lin in linears):
            return None
        if attn.o_proj.bias is not None or mlp.down_proj.bias is not None:
            return None
        if attn.o_proj.tp_size != 1 or mlp.down_proj.tp_size != 1:
            return None
        gate_up = mlp.gate_up_proj
        sizes = gate_up.output_sizes
        if len(sizes) != 2 or sizes[0] != sizes[1] or gate_up.weight.shape[0] % 2:
            return None
        rope = attn.rotary_emb
        if rope.cos_cache.dtype != weight.dtype:
            return None
        # Every list shares the calls that do not depend on the row count.
        shared = dict(
            in_norm=_norm(elementwise, layer.input_layernorm),
            rotary=_rotary(elementwise, rope),
            attn=attn.attn,
            attend_qkv=_attend_qkv(attn.attn, rope),
            post_norm=_norm(elementwise, layer.post_attention_layernorm),
        )
        for plans, (_, bind, bind_silu) in zip(layer_lists, bound, strict=True):
            plans.append(
                LayerPlan(
                    **shared,
                    qkv=bind(attn.qkv_proj),
                    o=bind(attn.o_proj),
                    gate_up_silu=bind_silu(gate_up),
                    down=bind(mlp.down_proj),
                )
            )
    first = layers[0].self_attn
    plan = DecodePlan(
        row_limits,
        layer_lists,
        [first.q_size, first.kv_size, first.kv_size],
        _norm(elementwise, model.norm),
    )
    plan.stacks = native_stacks(plan, [layer.self_attn.attn for layer in layers])
    return plan


def _norm(kernels, norm) -> Callable:
    rms_norm, add_rms_norm = kernels.rms_norm, kernels.add_rms_norm
    weight, eps = norm.weight, norm.eps

    def call(x, residual):
        if residual is None:
            return rms_norm(x, weight, eps)
        return add_rms_norm(x, residual, weight, eps)  # residual += x, in place

    call.native = (weight, eps)
    return call


def _attend_qkv(attn, rope) -> Callable:
    """RoPE, cache write and decode attention from the QKV rows, where the layer's
    bound attention has that path (the CPU kernels' one, worker/attention/backends/
    cpu_bound.py) and the step is decode-only; else None, and nothing done."""
    cos, sin = rope.cos_cache, rope.sin_cache

    def call(qkv, positions):
        # Read per step: binding a new cache or backend drops the layer's binding.
        fused = getattr(attn._bound, "decode_qkv", None)
        if fused is None:
            return None
        return fused(qkv, positions, cos, sin, forward_context._current)

    call.rope = (cos, sin)
    return call


def _rotary(kernels, rope) -> Callable:
    kernel = kernels.rotary_embedding
    cos, sin, head_dim = rope.cos_cache, rope.sin_cache, rope.head_dim

    def call(positions, q, k):
        kernel(q, k, positions, cos, sin, head_dim)

    return call
