"""One layer's CPU attention, bound to its cache once (CPUAttentionBackend.bind_layer).

A batch-1 decode step calls attention 30 times around a ~3 us kernel; the
generic path spent 28-46 us of Python per call on work that is the same for
every layer of every step: splitting the cache into K/V views, checking the
cache dtype and head shape, choosing kernels, keyword arguments, allocating the
output. Here that is done at bind time (the first forward), and the output is
one buffer per step shared by all layers (see `step_output`), so a call makes
three views, the cache write and the kernel call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from worker.attention.backends.cpu import CPUAttentionBackend, CPUAttentionMetadata
    from worker.layers.attention import Attention, LayerAttention


def step_output(
    plan: CPUAttentionMetadata, key: tuple, num_tokens: int, num_heads: int, head_dim: int, dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """This step's attention output ([num_tokens, num_heads, head_dim] and its
    [num_tokens, num_heads * head_dim] view), made by the first layer that asks.
    Sharing it is safe: a layer's output is read (by o_proj) before the next
    layer's attention writes it, and every row is written by each layer."""
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=dtype)
    pair = plan.outputs[key] = (out, out.view(num_tokens, num_heads * head_dim))
    return pair


def bind_cpu_layer(backend: CPUAttentionBackend, layer: Attention) -> LayerAttention:
    """The kernels' path for a model-dtype cache and a head shape they take; the
    caller sends fp8 caches and other shapes to the generic path."""
    kernels = backend.kernels
    key_cache, value_cache = backend.split_kv_cache(layer.kv_cache)
    num_heads, num_kv_heads, head_dim = layer.num_heads, layer.num_kv_heads, layer.head_dim
    # The model's activations: the cache's dtype, or float32 over a bf16/fp16 cache
    # (the kernels check the pair).
    dtype = layer.query_dtype or key_cache.dtype
    scale = layer.scale
    window = layer.sliding_window
    window_arg = window or 0
    kernel_prefill = backend.kernel_prefill_for(dtype, head_dim)
    cascade_ok = kernel_prefill and not window
    out_key = (num_heads, head_dim, dtype)
    write_kv_cache = kernels.write_kv_cache
    decode = kernels.paged_attention_decode
    prefill_kernel = kernels.paged_attention_prefill
    prefill_twin = backend._prefill

    def decode_into(query, out, plan):
        """This step's decode rows into `out`: the decode kernel, or where they may
        share a cached prefix (a cascade) the backend's general path."""
        if plan.cascade_blocks and cascade_ok:
            backend._decode(query, key_cache, value_cache, plan, out, scale, window)
            return
        decode(
            query,
            key_cache,
            value_cache,
            plan.decode_block_tables,
            plan.decode_seq_lens,
            plan.decode_rows,
            out,
            scale,
            window_arg,
        )

    def attend(query, key, value, plan):
        num_tokens = query.shape[0]
        query = query.view(num_tokens, num_heads, head_dim)
        key = key.view(num_tokens, num_kv_heads, head_dim)
        value = value.view(num_tokens, num_kv_heads, head_dim)
        write_kv_cache(key, value, key_cache, value_cache, plan.slot_mapping)
        pair = plan.outputs.get(out_key)
        if pair is None:
            pair = step_output(plan, out_key, num_tokens, num_heads, head_dim, dtype)
        out = pair[0]
        if plan.decode_seq_ids:
            decode_into(query, out, plan)
        if plan.prefills:
            if kernel_prefill:
                prefill_kernel(
                    query,
                    key_cache,
                    value_cache,
                    plan.prefill_block_tables,
                    plan.prefill_seq_lens,
                    plan.prefill_ranges,
                    out,
                    scale,
                    window_arg,
                )
            else:
                for seq, first, end, seq_len in plan.prefills:
                    out[first:end] = prefill_twin(
                        query[first:end],
                        key[first:end],
                        value[first:end],
                        key_cache,
                        value_cache,
                        plan.block_tables[seq],
                        seq_len,
                        scale,
                        window,
                    )
        return pair[1]

    rope_write_kv = kernels.rope_write_kv

    def decode_qkv(qkv, positions, cos_cache, sin_cache, plan):
        """A decode-only step from the fused QKV rows (worker/models/decode_plan.py):
        RoPE and the cache write in one kernel, then the decode kernel (with a
        cascade's shared prefix where the plan has one); None (nothing done) for
        any other step, which takes the rotary module and `attend`."""
        if plan.prefills or not plan.decode_seq_ids:
            return None
        num_tokens = qkv.shape[0]
        rope_write_kv(
            qkv,
            positions,
            cos_cache,
            sin_cache,
            key_cache,
            value_cache,
            plan.slot_mapping,
            num_heads,
            num_kv_heads,
            head_dim,
        )
        pair = plan.outputs.get(out_key)
        if pair is None:
            pair = step_output(plan, out_key, num_tokens, num_heads, head_dim, dtype)
        query = qkv.as_strided((num_tokens, num_heads, head_dim), (qkv.stride(0), head_dim, 1))
        decode_into(query, pair[0], plan)
        return pair[1]

    attend.decode_qkv = decode_qkv  # type: ignore[attr-defined]
    # What the native decode loop (kernels/cpu/decode_stack.cpp) binds for this layer
    # in place of decode_qkv, and whether its kernels take a cascade (decode_into's
    # test; the loop asks cpu_metadata.cascade_prefix_len per step).
    attend.decode_stack_args = (key_cache, value_cache, scale, window_arg, cascade_ok)  # type: ignore[attr-defined]
    return attend
