"""AWQ checkpoints (AutoAWQ's GEMM layout), 4 bits with zero points.

On disk, per linear (W is [out, in]):

    qweight [in, out / 8]       int32, codes packed along the output dim
    qzeros  [groups, out / 8]   int32, zeros packed the same way
    scales  [groups, out]       float16

Each word holds 8 output columns in the interleaved order 0, 2, 4, 6, 1, 3,
5, 7 (nibble i, from the lowest, is column ORDER[i] of its eight);
w = (code - zero) * scale, groups of `group_size` consecutive inputs.
"""

from __future__ import annotations

import torch

from shared.errors import ConfigError
from worker.layers.quantization.base import (
    LinearMethodBase,
    QuantizationConfig,
    is_layer_skipped,
    make_param,
)
from worker.layers.quantization.gptq import check_packable
from worker.layers.quantization.int_weight import apply_int_weight, set_int_weight, unpack_int32
from worker.layers.quantization.unquantized import UnquantizedLinearMethod

ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
# Column c of each eight lies in nibble _NIBBLE_OF_COLUMN[c].
_NIBBLE_OF_COLUMN = tuple(ORDER.index(c) for c in range(8))


class AWQConfig(QuantizationConfig):
    name = "awq"

    def __init__(self, group_size: int, modules_to_not_convert: list[str]) -> None:
        self.group_size = group_size
        self.modules_to_not_convert = modules_to_not_convert

    @classmethod
    def from_config(cls, config):
        bits = int(config.get("bits", config.get("w_bit", 4)))
        if bits != 4:
            raise ConfigError(f"AWQ with bits={bits} is not supported; supported: 4")
        version = str(config.get("version", "gemm")).lower()
        if version != "gemm":
            raise ConfigError(f"AWQ version {version!r} is not supported; supported: gemm")
        if not config.get("zero_point", True):
            raise ConfigError(
                "AWQ without zero points is not supported; supported: zero_point true"
            )
        group_size = int(config.get("group_size", config.get("q_group_size", 128)))
        if group_size <= 0:
            raise ConfigError(f"AWQ group_size must be > 0, got {group_size}")
        return cls(group_size, list(config.get("modules_to_not_convert") or []))

    def describe(self):
        return f"awq 4-bit, group {self.group_size}"

    def get_linear_method(self, prefix):
        if is_layer_skipped(prefix, self.modules_to_not_convert, self.packed_modules):
            return UnquantizedLinearMethod()
        return AWQLinearMethod(self.group_size)


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """[n, m / 8] AWQ words -> [n, m] codes in column order."""
    nibbles = unpack_int32(packed, 4, dim=1).view(packed.shape[0], -1, 8)
    order = torch.tensor(_NIBBLE_OF_COLUMN, device=packed.device)
    return nibbles.index_select(2, order).reshape(packed.shape[0], -1)


class AWQLinearMethod(LinearMethodBase):
    def __init__(self, group_size: int) -> None:
        self.group_size = group_size

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, params_dtype):
        out_features = sum(output_partition_sizes)
        check_packable(layer, input_size_per_partition, out_features, 8, self.group_size)
        num_groups = input_size_per_partition // self.group_size
        i32 = torch.int32
        qweight = torch.empty(input_size_per_partition, out_features // 8, dtype=i32)
        make_param(
            layer, "qweight", qweight, input_dim=0, output_dim=1, packed_dim=1, packed_factor=8
        )
        qzeros = torch.empty(num_groups, out_features // 8, dtype=i32)
        make_param(
            layer, "qzeros", qzeros, input_dim=0, output_dim=1, packed_dim=1, packed_factor=8
        )
        scales = torch.empty(num_groups, out_features, dtype=torch.float32)
        make_param(layer, "scales", scales, input_dim=0, output_dim=1)
        layer.act_dtype = params_dtype

    def process_weights_after_loading(self, layer):
        codes = unpack_awq(layer.qweight.data).t()  # [out, in]
        zeros = unpack_awq(layer.qzeros.data).t()  # [out, groups]
        in_features = codes.shape[1]
        g_idx = torch.arange(in_features, device=codes.device) // self.group_size
        set_int_weight(
            layer,
            ["qweight", "qzeros", "scales"],
            codes,
            layer.scales.data.t(),
            zeros.to(torch.float32),
            g_idx,
            4,
            layer.act_dtype,
        )

    def apply(self, layer, x, bias):
        return apply_int_weight(layer, x, bias)
