"""The memory a loaded model's weights hold, as the engine keeps them.

Parameters alone undercount it on CPU: a tied LM head computes from its own
packed copy (`packed_weight`, a plain attribute beside the embedding table), and
on CPUs without fast bf16 the half-stored linears keep a float32 copy beside
their panels (`weight_f32`, `packed_f32`: worker/layers/cpu_half_f32.py), 1.5x
the float32 linears in all. The runner reports this figure at start-up and
sizes a GPU's KV cache after it (worker/runner/kv_budget.py).
"""

from __future__ import annotations

import torch
from torch import nn


def module_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors `module` itself holds (not its children's): parameters, buffers
    and public tensor attributes (a packed copy of a weight), by name."""
    tensors = dict(module.named_parameters(recurse=False))
    tensors.update(module.named_buffers(recurse=False))
    for name, value in vars(module).items():
        if isinstance(value, torch.Tensor) and not name.startswith("_"):
            tensors.setdefault(name, value)
    return {name: t for name, t in tensors.items() if t is not None}


def tensor_identity(t: torch.Tensor) -> tuple:
    """Where the tensor's bytes are; oneDNN's opaque (packed float32) tensors have
    no storage to point at, and are never shared, so their own id will do."""
    try:
        return ("ptr", t.data_ptr(), t.numel() * t.element_size())
    except RuntimeError:
        return ("id", id(t))


def resident_weight_bytes(model: nn.Module) -> int:
    """Bytes of every distinct tensor `model`'s modules hold, but the attention
    layers' (their KV cache is not a weight)."""
    from worker.layers.attention import Attention

    seen: set[tuple] = set()
    total = 0
    for module in model.modules():
        if isinstance(module, Attention):
            continue
        for t in module_tensors(module).values():
            key = tensor_identity(t)
            if key not in seen:
                seen.add(key)
                total += t.numel() * t.element_size()
    return total
