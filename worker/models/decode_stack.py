"""A decode plan's layers run by the native loop (kernels/cpu/decode_stack.cpp).

The plan (decode_plan.py) binds each layer's kernels once, but still calls them
from Python: ~8 calls a layer, each a closure, pybind11's argument conversion and
a GIL release and take. At one row on a 30-layer model that is ~0.5 ms of a
~11 ms token, during which the other OpenMP thread spins. A `DecodeStack` holds
the same kernels with the same arguments (the plan's bound calls carry them:
`native` on linears and norms, `rope` on the fused attention call) and runs them
in a C++ loop with the GIL released once for the whole step, so its output is the
plan's bit for bit and the plan's loop stays its twin.

It runs a decode-only step of the CPU backend's metadata, a cascade's shared
prefix included (attention_over_prefix, then the decode kernel merging it, as the
backend's _decode does), once every layer is bound to its cache by the
bound-attention path (worker/attention/backends/cpu_bound.py, which lists what the
loop needs in `decode_stack_args`); anything else (prefill rows, an fp8 cache, a
layer not yet bound, oneDNN's float32 copy above 128 rows on AVX2) goes to the
plan's Python loop. One stack per layer list of the plan (its row routes: GEMV,
panel), built at the first step that can use it and again whenever a layer's
binding changes (a new KV cache or backend).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernels.cpu import load_cpu_kernels
from worker.attention import forward_context
from worker.attention.backends.cpu_metadata import cascade_prefix_len

if TYPE_CHECKING:
    import torch

    from worker.models.decode_plan import DecodePlan, LayerPlan

_UNBUILT = object()


class NativeStacks:
    def __init__(self, kernels, plan: DecodePlan, attns: list) -> None:
        self._kernels = kernels
        self._plan = plan
        self._attns = attns  # each layer's Attention module, whose `_bound` is read per step
        self._bounds: tuple = ()  # the bindings the stacks in `_stacks` were built over
        # id(layer list) -> (DecodeStack, whether its layers take a cascade: True, False
        # or None where only some do, block size), or None: not native
        self._stacks: dict[int, tuple | None] = {}

    def forward(self, layers: list[LayerPlan], hidden: torch.Tensor, positions: torch.Tensor):
        """The step through the native loop, as DecodePlan.forward returns it; None
        (nothing done) where the step or the layers are not one it takes."""
        metadata = forward_context._current
        prefills = getattr(metadata, "prefills", None)
        if prefills is None or prefills or not metadata.decode_seq_ids:
            return None
        if not hidden.is_contiguous():  # the loop's norms take contiguous rows only
            return None
        bounds = tuple(attn._bound for attn in self._attns)
        if bounds != self._bounds:  # identity per layer: a new cache or backend rebinds
            self._bounds, self._stacks = bounds, {}
        built = self._stacks.get(id(layers), _UNBUILT)
        if built is _UNBUILT:
            built = self._stacks[id(layers)] = self._build(layers, bounds)
        if built is None:
            return None
        stack, cascade, block_size = built
        tables = metadata.decode_block_tables
        prefix_len = cascade_prefix_len(metadata, block_size) if cascade is not False else 0
        if prefix_len and cascade is None:
            return None  # the Python loop: a cascade in some layers (no window), not in others
        return stack.forward(
            hidden,
            positions,
            metadata.slot_mapping,
            tables,
            metadata.decode_seq_lens,
            metadata.decode_rows,
            prefix_len,
            tables[0] if prefix_len else None,
        )

    def _build(self, layers: list[LayerPlan], bounds: tuple) -> tuple | None:
        """(a DecodeStack over layers with these bindings, whether they take a cascade,
        the caches' block size), or None where one is missing."""
        first = self._attns[0]
        final = getattr(self._plan.final_norm, "native", None)
        if final is None:
            return None
        stack = self._kernels.DecodeStack(
            first.num_heads, first.num_kv_heads, first.head_dim, final[0], final[1]
        )
        cascades = set()
        for layer, bound, attn in zip(layers, bounds, self._attns, strict=True):
            args = getattr(bound, "decode_stack_args", None)
            norms = [getattr(c, "native", None) for c in (layer.in_norm, layer.post_norm)]
            linears = [
                getattr(c, "native", None)
                for c in (layer.qkv, layer.o, layer.gate_up_silu, layer.down)
            ]
            rope = getattr(layer.attend_qkv, "rope", None)
            if args is None or rope is None or None in linears or None in norms:
                return None
            if (attn.num_heads, attn.num_kv_heads, attn.head_dim) != (
                first.num_heads,
                first.num_kv_heads,
                first.head_dim,
            ):
                return None
            qkv, o, gate_up, down = linears
            key_cache, value_cache, scale, window, layer_cascade_ok = args
            cascades.add(layer_cascade_ok)
            stack.add_layer(
                norms[0][0],
                norms[0][1],
                norms[1][0],
                norms[1][1],
                qkv,
                o,
                gate_up,
                down,
                rope[0],
                rope[1],
                key_cache,
                value_cache,
                scale,
                window,
            )
        cascade = cascades.pop() if len(cascades) == 1 else None
        return stack, cascade, key_cache.shape[1]


def native_stacks(plan: DecodePlan, attns: list) -> NativeStacks | None:
    """The plan's native loop, or None where this build has none."""
    kernels = load_cpu_kernels()
    if kernels is None or not hasattr(kernels, "DecodeStack"):
        return None
    return NativeStacks(kernels, plan, attns)
