"""Bytes of weights one decoded token reads, as the engine stores them.

At one stream a decode step reads every weight once, so its speed limit is

    decode bound (tokens/s) = read bandwidth (bytes/s) / weight bytes read per token

with the read bandwidth bench/roofline.py measures. "As stored" matters: the same
model held in bf16 reads half the bytes of float32, whatever dtype the arithmetic
runs in (llama.cpp on AVX2 widens half-precision weights in registers).

Counted: every tensor the model's modules hold (parameters, buffers and plain
tensor attributes, such as a packed copy of a weight), once each, except

* lookup tables (the input embedding, RoPE's cos/sin cache): a token reads one
  row of each; and the attention layers' KV cache, which is not a weight;
* a module's `weight` where the module also holds `packed_weight` (the LM head
  tied to the embedding keeps the table and computes from its packed copy);
* the float32 copies kept beside half panels on CPUs without fast bf16
  (`weight_f32`, `packed_f32`: worker/layers/cpu_half_f32.py): only batches of
  more than 8 rows read them, a single stream reads the half panels.

`params_bytes(num_params, dtype)` is the same figure for an engine we cannot look
inside (vLLM), from bench/model_flops.py's weight count and the dtype it ran in.
"""

from __future__ import annotations

# Copies that only batches past the GEMV's rows read (cpu_half_f32.float32_copy).
_BATCH_ONLY_COPIES = ("weight_f32", "packed_f32")
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "int8": 1}


def _module_tensors(module):
    from worker.models.weight_memory import module_tensors

    tensors = module_tensors(module)
    if tensors.get("packed_weight") is not None:
        tensors.pop("weight", None)
    for name in _BATCH_ONLY_COPIES:
        tensors.pop(name, None)
    return list(tensors.values())


def stored_weight_bytes(model) -> int:
    """Bytes a decoded token reads from `model` (an nn.Module), as stored."""
    from worker.models.weight_memory import tensor_identity

    seen: set[tuple] = set()
    total = 0
    for module in model.modules():
        if _is_lookup_table(module):
            continue  # a tied LM head still counts the table, through itself
        for t in _module_tensors(module):
            key = tensor_identity(t)
            if key not in seen:
                seen.add(key)
                total += t.numel() * t.element_size()
    return total


def _is_lookup_table(module) -> bool:
    """Modules whose tensors a token reads only in part: the embedding table, RoPE's
    cache, and the attention layers, whose tensors are the KV cache (read in
    proportion to the context, not a weight)."""
    from worker.layers.attention import Attention
    from worker.layers.embedding import ParallelLMHead, VocabParallelEmbedding
    from worker.layers.rotary import RotaryEmbedding

    if isinstance(module, ParallelLMHead):
        return False
    return isinstance(module, VocabParallelEmbedding | RotaryEmbedding | Attention)


def params_bytes(num_params: int, dtype: str) -> int | None:
    """`num_params` weights held in `dtype` (a torch dtype name); None if unknown."""
    itemsize = _ITEMSIZE.get(dtype)
    return None if itemsize is None else num_params * itemsize
