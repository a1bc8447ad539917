"""Integer quantization at load, from a dense (bf16, fp16, float32) checkpoint.

`--quantization int8`: per output row, symmetric: scale = max|w| / 127,
code = round(w / scale) + 128 in [1, 255] (zero at 128).
`--quantization int4`: per row and group of `group_size` inputs (128, or the
largest of 64 and 32 that divides the layer's inputs, else the whole row),
asymmetric min-max: scale = (max - min) / 15 with min <= 0 <= max,
zero = round(-min / scale), code = clamp(round(w / scale) + zero, 0, 15).

The layer loads its dense weight as an unquantized one would and quantizes
it once, after loading, into the integer form of int_weight.py.
"""

from __future__ import annotations

import torch

from worker.layers.quantization.base import QuantizationConfig, whole_input_rows
from worker.layers.quantization.int_weight import apply_int_weight, set_int_weight
from worker.layers.quantization.unquantized import UnquantizedLinearMethod

INT4_GROUP_SIZES = (128, 64, 32)


def quantize_int8_rows(weight: torch.Tensor):
    """W [out, in] -> (codes [out, in], scales [out, 1], zeros [out, 1]), float32 math."""
    w = weight.to(torch.float32)
    scales = (w.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-12)
    codes = torch.round(w / scales).clamp(-127, 127) + 128
    return codes.to(torch.uint8), scales, torch.full_like(scales, 128.0)


def int4_group_size(in_features: int) -> int:
    return next((g for g in INT4_GROUP_SIZES if in_features % g == 0), in_features)


def quantize_int4_groups(weight: torch.Tensor, group_size: int):
    """W [out, in] -> (codes [out, in], scales [out, groups], zeros [out, groups])."""
    out_features, in_features = weight.shape
    w = weight.to(torch.float32).view(out_features, in_features // group_size, group_size)
    lo = w.amin(dim=2).clamp(max=0)
    hi = w.amax(dim=2).clamp(min=0)
    scales = ((hi - lo) / 15).clamp(min=1e-12)  # [out, groups]
    zeros = torch.round(-lo / scales).clamp(0, 15)
    codes = (torch.round(w / scales[..., None]) + zeros[..., None]).clamp(0, 15)
    return codes.view(out_features, in_features).to(torch.uint8), scales, zeros


class _QuantizeAtLoad(UnquantizedLinearMethod):
    """Loads the dense weight, then swaps it for integer codes."""

    bits: int

    def process_weights_after_loading(self, layer):
        weight, columns = whole_input_rows(layer)
        codes, scales, zeros = self.quantize(weight)
        group = weight.shape[1] // scales.shape[1]
        g_idx = torch.arange(weight.shape[1], device=weight.device) // group
        if columns is not None:  # this rank's inputs, and the groups they fall in
            codes, g_idx = codes[:, columns], g_idx[columns]
            first, last = int(g_idx[0]), int(g_idx[-1]) + 1
            scales, zeros, g_idx = scales[:, first:last], zeros[:, first:last], g_idx - first
        set_int_weight(layer, ["weight"], codes, scales, zeros, g_idx, self.bits, weight.dtype)

    def apply(self, layer, x, bias):
        return apply_int_weight(layer, x, bias)

    def apply_silu_and_mul(self, layer, x, bias):
        return None


class Int8LinearMethod(_QuantizeAtLoad):
    bits = 8

    def quantize(self, weight):
        return quantize_int8_rows(weight)


class Int4LinearMethod(_QuantizeAtLoad):
    bits = 4

    def quantize(self, weight):
        return quantize_int4_groups(weight, int4_group_size(weight.shape[1]))


class Int8Config(QuantizationConfig):
    name = "int8"
    quantizes_at_load = True

    @classmethod
    def from_config(cls, config):
        return cls()

    def describe(self):
        return "int8 per channel (quantized at load)"

    def get_linear_method(self, prefix):
        return Int8LinearMethod()


class Int4Config(QuantizationConfig):
    name = "int4"
    quantizes_at_load = True

    @classmethod
    def from_config(cls, config):
        return cls()

    def describe(self):
        return "int4 groups of 128 (quantized at load)"

    def get_linear_method(self, prefix):
        return Int4LinearMethod()
