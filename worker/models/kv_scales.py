"""Calibrated FP8 KV cache scales from checkpoints that carry them.

An FP8 KV cache stores K / k_scale and V / v_scale in e4m3 (one scale per layer
and tensor). Checkpoints made for vLLM's `--kv-cache-dtype fp8` carry them under
several names; they go to the layer's Attention module (`k_scale`, `v_scale`,
floats), not to parameters. Like vLLM, a checkpoint without them runs with 1.0,
and the scales matter only when the cache is fp8 (the runner resets them to 1.0
otherwise).

Names, as vLLM's loader maps them (weight_utils.maybe_remap_kv_scale_name and
compressed-tensors' output_scale):
* `<layer>.self_attn.k_scale` / `.v_scale`      vLLM fp8, llm-compressor
* `<layer>.self_attn.k_proj.k_scale` / v_proj   ModelOpt
* `<layer>.self_attn.k_proj.output_scale` / v   compressed-tensors kv_cache_scheme
* `<layer>.self_attn.kv_scale`                   older AutoFP8: both K and V
`q_scale` (a query scale for FP8 attention math) has no use here: the query
stays in the model's dtype, so it is read and dropped.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from shared.errors import ConfigError

_PATTERNS = [
    (re.compile(r"^(.*\.self_attn)\.([kv])_proj\.\2_scale$"), None),
    (re.compile(r"^(.*\.self_attn)\.([kv])_proj\.output_scale$"), None),
    (re.compile(r"^(.*\.self_attn)\.([kv])_scale$"), None),
    (re.compile(r"^(.*\.self_attn)\.kv_scale$"), "kv"),
    (re.compile(r"^(.*\.self_attn)\.(?:q_proj\.)?q_scale$"), "q"),
]


def kv_scale_target(name: str) -> tuple[str, str] | None:
    """(the attention block's module name, "k" | "v" | "kv" | "q") for a scale tensor
    of the checkpoint, else None (an ordinary weight)."""
    for pattern, which in _PATTERNS:
        match = pattern.match(name)
        if match:
            return match.group(1), which or match.group(2)
    return None


def load_kv_scale(model: nn.Module, name: str, tensor: torch.Tensor) -> bool:
    """Set the Attention module's k_scale / v_scale from checkpoint tensor `name`;
    False when `name` is no KV scale."""
    target = kv_scale_target(name)
    if target is None:
        return False
    block, which = target
    if which == "q":
        return True
    try:
        attn = model.get_submodule(f"{block}.attn")
    except AttributeError as exc:
        raise ConfigError(f"checkpoint tensor {name!r}: no attention layer at {block}") from exc
    values = torch.as_tensor(tensor).float().flatten()
    if values.numel() != 1 or not bool(torch.isfinite(values).all()) or float(values) <= 0:
        raise ConfigError(
            f"checkpoint tensor {name!r} must be one positive per-tensor scale "
            f"(per-head KV scales are not supported), got shape {tuple(tensor.shape)}"
        )
    for part in which:  # "kv" sets both
        setattr(attn, f"{part}_scale", float(values))
    return True
