"""A decoder stack's kernels bound once, for decode steps of any size.

A one-row decode step of a 30-layer model spends about as long in Python
between its kernels as in the weight-streaming GEMVs themselves: each layer
goes through ~8 module forwards, the quant method, the packed-linear router
(row count, layout and kernel checks) and the elementwise dispatch, ~35 us of
thread time per layer that decides the same thing every step. Here those
decisions are taken once per model: each layer becomes a `LayerPlan` of
closures over the very kernels and arguments the module path would call, and
`DecodePlan.forward` runs them in a flat loop. Each layer is bound twice, once
over the GEMV kernels (steps of 1-6 rows) and once over the panel kernel (more
rows), as cpu_packed routes a step's rows; the step picks one list. On a
decode-only step RoPE, the KV-cache write and the decode kernel go in one fused
call from the QKV rows (rope_write_kv, kernels/cpu/elementwise.cpp; then the
decode kernel), without the split, the views and the attention module. The
kernels, their arguments and their order are those of the module path, so the
results are bit for bit the same (tests/worker/models/test_decode_plan.py); the
module path stays the twin.

The model runs the plan for steps of 1-6 rows of any kind (a step with prefill
rows takes the split, the rotary kernel and the attention module in the plan's
loop) and for decode-only steps of any size (`covers`); a larger step with
prefill rows keeps the module path.

`build_decode_plan` returns None (the model keeps its module path) unless every
layer is the plain shape this covers: one rank, no q/k norm, unquantized panel-
packed bf16 weights with the GEMV and panel kernels, the fused norm and RoPE
kernels, no bias on o_proj and down_proj (RowParallelLinear adds theirs after
the sum).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernels.cpu import load_cpu_kernels
from worker.attention import forward_context
from worker.layers import cpu_packed
from worker.layers.quantization.unquantized import UnquantizedLinearMethod

# The rows cpu_packed sends to the GEMV kernels; more go to the panel kernel.
MAX_ROWS = cpu_packed.GEMV_MAX_ROWS


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
        layers: list[LayerPlan],
        panel_layers: list[LayerPlan],
        sizes: list[int],
        final_norm: Callable,
    ) -> None:
        self.layers = layers  # linears on the GEMV kernels: steps of 1-MAX_ROWS rows
        self.panel_layers = panel_layers  # on the panel kernel: more rows
        self.sizes = sizes  # [q_size, kv_size, kv_size]
        self.final_norm = final_norm

    @staticmethod
    def covers(num_rows: int) -> bool:
        """Whether a step of num_rows rows runs here: 1-MAX_ROWS rows of any kind,
        more only where every row decodes (no prefill rows in the step's metadata)."""
        if num_rows <= MAX_ROWS:
            return True
        # Backends without the decode/prefill partition keep the module path.
        prefills = getattr(forward_context._current, "prefills", None)
        return prefills is not None and not prefills

    def layers_for(self, num_rows: int) -> list[LayerPlan]:
        """The layers on the kernels cpu_packed routes num_rows rows to (GEMV or panel):
        decided once per step, not per linear."""
        return self.layers if num_rows <= MAX_ROWS else self.panel_layers

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """hidden: the embedded rows [tokens, hidden] -> the final norm's output."""
        sizes = self.sizes
        residual = None
        for layer in self.layers_for(hidden.shape[0]):
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
    if not layers or not weight.is_cpu or weight.dtype != torch.bfloat16:
        return None
    if model.embed_tokens.tp_size != 1:
        return None
    if not all(_is_panel_linear(layer.self_attn.qkv_proj) for layer in layers):
        return None  # before asking for the GEMV kernels: they build on first ask
    gemv = cpu_packed._gemv_kernels()
    panel = load_cpu_kernels()  # cpu_packed's kernel for more than MAX_ROWS rows
    elementwise = fused_elementwise_kernels(weight)
    if gemv is None or elementwise is None or panel is None or not panel.bf16_gemm_supported():
        return None
    gemv_kernels = (gemv.gemv_bf16_linear, gemv.gemv_bf16_linear_silu)
    panel_kernels = (panel.bf16_panel_linear, panel.bf16_panel_linear_silu)
    plans, panel_plans = [], []
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        if attn.qk_norm or not all(_is_panel_linear(lin) for lin in linears):
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
        if rope.cos_cache.dtype != torch.bfloat16:
            return None
        # Both lists share the calls that do not depend on the row count.
        shared = dict(
            in_norm=_norm(elementwise, layer.input_layernorm),
            rotary=_rotary(elementwise, rope),
            attn=attn.attn,
            attend_qkv=_attend_qkv(attn.attn, rope),
            post_norm=_norm(elementwise, layer.post_attention_layernorm),
        )
        plans.append(LayerPlan(**shared, **_linears(*gemv_kernels, layer)))
        panel_plans.append(LayerPlan(**shared, **_linears(*panel_kernels, layer)))
    first = layers[0].self_attn
    return DecodePlan(
        plans,
        panel_plans,
        [first.q_size, first.kv_size, first.kv_size],
        _norm(elementwise, model.norm),
    )


def _is_panel_linear(linear) -> bool:
    return (
        type(linear.quant_method) is UnquantizedLinearMethod
        and getattr(linear, "weight_is_packed", False)
        and linear.weight.dim() == 3  # the panel layout (a 2-D packed one is oneDNN's)
        and linear.weight.dtype == torch.bfloat16
    )


def _linears(linear, linear_silu, layer) -> dict[str, Callable]:
    """A layer's four linears on one kernel pair (x [tokens, in] contiguous, as the
    model's rows are: what cpu_packed._over_rows passes straight on)."""
    attn, mlp = layer.self_attn, layer.mlp
    return dict(
        qkv=_linear(linear, attn.qkv_proj),
        o=_linear(linear, attn.o_proj),
        gate_up_silu=_linear(linear_silu, mlp.gate_up_proj),
        down=_linear(linear, mlp.down_proj),
    )


def _linear(kernel, linear) -> Callable:
    packed, bias = linear.weight, linear.bias

    def call(x):
        return kernel(x, packed, bias)

    return call


def _norm(kernels, norm) -> Callable:
    rms_norm, add_rms_norm = kernels.rms_norm, kernels.add_rms_norm
    weight, eps = norm.weight, norm.eps

    def call(x, residual):
        if residual is None:
            return rms_norm(x, weight, eps)
        return add_rms_norm(x, residual, weight, eps)  # residual += x, in place

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

    return call


def _rotary(kernels, rope) -> Callable:
    kernel = kernels.rotary_embedding
    cos, sin, head_dim = rope.cos_cache, rope.sin_cache, rope.head_dim

    def call(positions, q, k):
        kernel(q, k, positions, cos, sin, head_dim)

    return call
