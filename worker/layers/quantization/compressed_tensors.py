"""compressed-tensors checkpoints (llm-compressor's output): `pack-quantized`
integer weights (W4A16, W8A16) and `float-quantized` FP8 weights.

    pack-quantized, per linear:
      weight_packed      [out, in / pf]   int32, codes + 2**(bits-1) packed along inputs
      weight_scale       [out, groups]    (groups = 1 for strategy "channel")
      weight_zero_point  [out / pf, groups] int32, packed along outputs (asymmetric only)
      weight_g_idx       [in]             int32 (actorder "group" only)
      weight_shape       [2]              the unpacked shape (read, not needed)
    float-quantized: weight [out, in] float8_e4m3fn, weight_scale [out, 1]
      (strategy "channel") or [1] ("tensor"); input_scale where activations are static.

w = (signed code - zero point) * scale. Activation quantization schemes
(FP8 inputs) are served weight-only: inputs stay in the model dtype.
"""

from __future__ import annotations

import re

import torch

from shared.errors import ConfigError
from shared.logging import get_logger
from worker.layers.quantization.base import (
    LinearMethodBase,
    QuantizationConfig,
    expand_packed_names,
    is_layer_skipped,
    make_ignored_param,
    make_param,
    make_per_shard_param,
)
from worker.layers.quantization.fp8_weight import FP8, apply_fp8_weight, set_fp8_weight
from worker.layers.quantization.gptq import check_packable
from worker.layers.quantization.int_weight import apply_int_weight, set_int_weight, unpack_int32
from worker.layers.quantization.unquantized import UnquantizedLinearMethod

FORMATS = ("pack-quantized", "float-quantized")

logger = get_logger(__name__)


class WeightScheme:
    """One config group's `weights` arguments, checked."""

    def __init__(self, args: dict, fmt: str) -> None:
        self.type, self.bits = args.get("type", "int"), int(args.get("num_bits", 8))
        self.strategy = args.get("strategy", "tensor")
        self.symmetric = bool(args.get("symmetric", True))
        self.group_size = int(args.get("group_size") or -1)
        self.actorder = args.get("actorder")
        self.format = fmt
        if fmt == "pack-quantized":
            if self.type != "int" or self.bits not in (4, 8):
                raise ConfigError(
                    f"compressed-tensors pack-quantized {self.type}{self.bits} weights are not "
                    "supported; supported: int4, int8"
                )
            if self.strategy not in ("group", "channel"):
                raise ConfigError(
                    f"compressed-tensors int weight strategy {self.strategy!r} is not supported; "
                    "supported: group, channel"
                )
            if self.strategy == "group" and self.group_size <= 0:
                raise ConfigError("compressed-tensors strategy group needs a group_size > 0")
        elif fmt == "float-quantized":
            if self.type != "float" or self.bits != 8:
                raise ConfigError(
                    f"compressed-tensors float-quantized {self.type}{self.bits} weights are not "
                    "supported; supported: float8 (e4m3)"
                )
            if self.strategy not in ("channel", "tensor"):
                raise ConfigError(
                    f"compressed-tensors fp8 weight strategy {self.strategy!r} is not supported; "
                    "supported: channel, tensor"
                )
        else:
            raise ConfigError(
                f"compressed-tensors format {fmt!r} is not supported; supported: "
                f"{', '.join(FORMATS)}"
            )


class CompressedTensorsConfig(QuantizationConfig):
    name = "compressed-tensors"

    def __init__(
        self,
        groups: list[tuple[list[str], WeightScheme, bool]],
        ignore: list[str],
        kv_cache_scales: bool = False,
    ):
        self.groups, self.ignore = groups, ignore
        # kv_cache_scheme: the checkpoint carries k/v output scales, which the
        # loader hands to the attention layers (worker/models/kv_scales.py).
        self.kv_cache_scales = kv_cache_scales

    @classmethod
    def from_config(cls, config):
        kv_scheme = config.get("kv_cache_scheme")
        if kv_scheme:
            _check_kv_cache_scheme(kv_scheme)
        fmt = config.get("format", "pack-quantized")
        groups = []
        for name, group in (config.get("config_groups") or {}).items():
            inputs = group.get("input_activations")
            if inputs and inputs.get("type", "int") != "float":
                raise ConfigError(
                    f"compressed-tensors group {name}: int8 activation quantization (W8A8 int) "
                    "is not supported (the kernels are weight-only); supported: weight-only "
                    "W4A16 / W8A16 (pack-quantized) and FP8 weights (float-quantized, its "
                    "float8 activations served weight-only)"
                )
            if inputs:
                logger.warning(
                    "compressed-tensors group %s: float8 activations are not applied; "
                    "activations stay in the model's dtype (weight-only FP8)",
                    name,
                )
            weights = group.get("weights")
            if not weights:
                raise ConfigError(f"compressed-tensors group {name} quantizes no weights")
            scheme = WeightScheme(weights, group.get("format") or fmt)
            static = bool(inputs) and not inputs.get("dynamic", False)
            groups.append((list(group.get("targets") or []), scheme, static))
        if not groups and not kv_scheme:
            raise ConfigError("compressed-tensors config has no config_groups")
        return cls(groups, list(config.get("ignore") or []), bool(kv_scheme))

    def describe(self):
        parts = [
            f"compressed-tensors {s.format} {s.type}{s.bits} {s.strategy}"
            for _, s, _ in self.groups
        ]
        if self.kv_cache_scales:
            parts.append("fp8 KV cache scales (used with --kv-cache-dtype fp8)")
        return ", ".join(parts)

    def _group_of(self, name: str):
        for targets, scheme, static in self.groups:
            for target in targets:
                if target == "Linear" or name == target or name.endswith("." + target):
                    return scheme, static
                if target.startswith("re:") and re.match(target[3:], name):
                    return scheme, static
        return None

    def get_linear_method(self, prefix):
        if not self.groups or is_layer_skipped(prefix, self.ignore, self.packed_modules):
            return UnquantizedLinearMethod()  # no groups: a KV-cache-only checkpoint
        found = [self._group_of(name) for name in expand_packed_names(prefix, self.packed_modules)]
        if found[0] is None or any(f is None or f[0] is not found[0][0] for f in found):
            raise ConfigError(
                f"{prefix}: no config group targets it (or its fused parts fall in different "
                "groups); list it under ignore to keep it dense"
            )
        scheme, static = found[0]
        if scheme.format == "float-quantized":
            return CompressedTensorsFp8Method(scheme, static)
        return CompressedTensorsIntMethod(scheme, static)


class CompressedTensorsIntMethod(LinearMethodBase):
    def __init__(self, scheme: WeightScheme, static_inputs: bool) -> None:
        self.scheme, self.static_inputs = scheme, static_inputs

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, params_dtype):
        s = self.scheme
        pack = 32 // s.bits
        out_features = sum(output_partition_sizes)
        group_size = s.group_size if s.strategy == "group" else -1
        check_packable(layer, input_size_per_partition, out_features, pack, group_size)
        i32 = torch.int32
        weight = torch.empty(out_features, input_size_per_partition // pack, dtype=i32)
        make_param(
            layer, "weight_packed", weight, input_dim=1, output_dim=0, packed_dim=1,
            packed_factor=pack,
        )  # fmt: skip
        num_groups = 1 if group_size == -1 else input_size_per_partition // group_size
        group_dim = None if group_size == -1 else 1
        if s.actorder == "group" and layer.input_size != input_size_per_partition:
            num_groups, group_dim = layer.input_size // group_size, None
        scale = torch.empty(out_features, num_groups, dtype=torch.float32)
        make_param(layer, "weight_scale", scale, input_dim=group_dim, output_dim=0)
        if not s.symmetric:
            zero = torch.empty(out_features // pack, num_groups, dtype=i32)
            make_param(
                layer, "weight_zero_point", zero, input_dim=group_dim, output_dim=0,
                packed_dim=0, packed_factor=pack,
            )  # fmt: skip
        if s.actorder == "group":
            g_idx = torch.empty(input_size_per_partition, dtype=i32)
            make_param(layer, "weight_g_idx", g_idx, input_dim=0)
        make_ignored_param(layer, "weight_shape", torch.zeros(2, dtype=torch.int64))
        if self.static_inputs:
            make_per_shard_param(layer, "input_scale", len(output_partition_sizes))
        layer.act_dtype = params_dtype

    def process_weights_after_loading(self, layer):
        s = self.scheme
        codes = unpack_int32(layer.weight_packed.data, s.bits, dim=1)  # [out, in]
        num_groups = layer.weight_scale.shape[1]
        if s.symmetric:
            zeros = torch.full((codes.shape[0], num_groups), 2.0 ** (s.bits - 1))
        else:  # stored like the codes: zero point + 2**(bits-1)
            zeros = unpack_int32(layer.weight_zero_point.data, s.bits, dim=0).to(torch.float32)
        in_features = codes.shape[1]
        if s.actorder == "group":
            g_idx = layer.weight_g_idx.data.to(torch.int64)
        else:
            g_idx = torch.arange(in_features, device=codes.device) // (in_features // num_groups)
        drop = [n for n in ("weight_packed", "weight_scale", "weight_zero_point", "weight_g_idx",
                            "weight_shape", "input_scale") if hasattr(layer, n)]  # fmt: skip
        scales = layer.weight_scale.data
        set_int_weight(layer, drop, codes, scales, zeros, g_idx, s.bits, layer.act_dtype)

    def apply(self, layer, x, bias):
        return apply_int_weight(layer, x, bias)


class CompressedTensorsFp8Method(LinearMethodBase):
    def __init__(self, scheme: WeightScheme, static_inputs: bool) -> None:
        self.scheme, self.static_inputs = scheme, static_inputs

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, params_dtype):
        out_features = sum(output_partition_sizes)
        weight = torch.empty(out_features, input_size_per_partition, dtype=FP8)
        make_param(layer, "weight", weight, input_dim=1, output_dim=0)
        if self.scheme.strategy == "channel":
            scale = torch.empty(out_features, 1, dtype=torch.float32)
            make_param(layer, "weight_scale", scale, output_dim=0)
        else:
            make_per_shard_param(layer, "weight_scale", len(output_partition_sizes))
        if self.static_inputs:
            make_per_shard_param(layer, "input_scale", len(output_partition_sizes))
        layer.act_dtype = params_dtype

    def process_weights_after_loading(self, layer):
        scales = layer.weight_scale.data
        if self.scheme.strategy == "tensor":
            sizes = torch.tensor(layer.output_partition_sizes, device=scales.device)
            scales = scales.repeat_interleave(sizes)[:, None]  # [out, 1]
        drop = ["weight", "weight_scale"] + (["input_scale"] if self.static_inputs else [])
        set_fp8_weight(layer, drop, layer.weight.data, scales, layer.act_dtype)

    def apply(self, layer, x, bias):
        return apply_fp8_weight(layer, x, bias)


def _check_kv_cache_scheme(scheme: dict) -> None:
    """The one KV cache scheme an e4m3 cache can serve: 8-bit float, one static
    scale per tensor (what llm-compressor writes for vLLM's fp8 cache)."""
    kind = (
        scheme.get("type", "float"),
        scheme.get("num_bits", 8),
        scheme.get("strategy", "tensor"),
    )
    if kind != ("float", 8, "tensor") or scheme.get("dynamic", False):
        raise ConfigError(
            f"compressed-tensors kv_cache_scheme {scheme} is not supported; supported: "
            "type float, num_bits 8, strategy tensor, static (served with --kv-cache-dtype fp8)"
        )
