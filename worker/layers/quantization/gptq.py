"""GPTQ checkpoints (AutoGPTQ / GPTQModel / optimum format), 4 and 8 bits.

On disk, per linear (W is [out, in], pf = 32 / bits codes per int32):

    qweight [in / pf, out]          int32, codes packed along the input dim
    qzeros  [groups, out / pf]      int32, zero - 1 packed along the output dim
                                    (checkpoint_format "gptq"; "gptq_v2" stores zero)
    scales  [groups, out]           float16
    g_idx   [in]                    int32, the group of each input feature;
                                    desc_act (act-order) makes it non-monotone

groups = in / group_size (1 for group_size -1); w = (code - zero) * scale.
Under tensor parallelism a row-parallel act-order layer keeps every group's
scales and zeros (its inputs' groups are spread over all of them).
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
from worker.layers.quantization.int_weight import apply_int_weight, set_int_weight, unpack_int32
from worker.layers.quantization.unquantized import UnquantizedLinearMethod

SUPPORTED_BITS = (4, 8)


class GPTQConfig(QuantizationConfig):
    name = "gptq"

    def __init__(
        self,
        bits: int,
        group_size: int,
        desc_act: bool,
        sym: bool,
        zeros_stored_minus_one: bool,
        modules_to_not_convert: list[str],
    ) -> None:
        self.bits, self.group_size, self.desc_act, self.sym = bits, group_size, desc_act, sym
        self.zeros_stored_minus_one = zeros_stored_minus_one
        self.modules_to_not_convert = modules_to_not_convert

    @classmethod
    def from_config(cls, config):
        bits = int(config.get("bits", 4))
        if bits not in SUPPORTED_BITS:
            raise ConfigError(
                f"GPTQ with bits={bits} is not supported; supported: "
                f"{', '.join(map(str, SUPPORTED_BITS))}"
            )
        group_size = int(config.get("group_size", 128))
        if group_size != -1 and group_size <= 0:
            raise ConfigError(f"GPTQ group_size must be -1 or > 0, got {group_size}")
        if config.get("lm_head"):
            raise ConfigError("GPTQ with a quantized lm_head (lm_head: true) is not supported")
        fmt = config.get("checkpoint_format", "gptq")
        if fmt not in ("gptq", "gptq_v2"):
            raise ConfigError(
                f"GPTQ checkpoint_format {fmt!r} is not supported; supported: gptq, gptq_v2"
            )
        return cls(
            bits,
            group_size,
            bool(config.get("desc_act", False)),
            bool(config.get("sym", True)),
            fmt == "gptq",
            list(config.get("modules_to_not_convert") or []),
        )

    def describe(self):
        order = ", act-order" if self.desc_act else ""
        return f"gptq {self.bits}-bit, group {self.group_size}{order}"

    def get_linear_method(self, prefix):
        if is_layer_skipped(prefix, self.modules_to_not_convert, self.packed_modules):
            return UnquantizedLinearMethod()
        return GPTQLinearMethod(self)


def check_packable(layer, in_features: int, out_features: int, pack: int, group_size: int):
    """Shard sizes the packed layout can hold, or a ConfigError naming them."""
    if in_features % pack or out_features % pack:
        raise ConfigError(
            f"{layer.prefix}: [{out_features} x {in_features}] per rank does not divide into "
            f"words of {pack} codes"
        )
    if group_size > 0 and in_features % group_size:
        raise ConfigError(
            f"{layer.prefix}: {in_features} input features per rank are not a whole number "
            f"of groups of {group_size}"
        )


class GPTQLinearMethod(LinearMethodBase):
    def __init__(self, config: GPTQConfig) -> None:
        self.config = config

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, params_dtype):
        cfg = self.config
        pack = 32 // cfg.bits
        out_features = sum(output_partition_sizes)
        check_packable(layer, input_size_per_partition, out_features, pack, cfg.group_size)
        partitioned = layer.input_size != input_size_per_partition
        if cfg.group_size == -1:
            num_groups, group_dim = 1, None
        elif cfg.desc_act and partitioned:
            num_groups, group_dim = layer.input_size // cfg.group_size, None
        else:
            num_groups, group_dim = input_size_per_partition // cfg.group_size, 0
        i32 = torch.int32
        qweight = torch.empty(input_size_per_partition // pack, out_features, dtype=i32)
        make_param(
            layer, "qweight", qweight, input_dim=0, output_dim=1, packed_dim=0, packed_factor=pack
        )
        make_param(layer, "g_idx", torch.empty(input_size_per_partition, dtype=i32), input_dim=0)
        qzeros = torch.empty(num_groups, out_features // pack, dtype=i32)
        make_param(
            layer,
            "qzeros",
            qzeros,
            input_dim=group_dim,
            output_dim=1,
            packed_dim=1,
            packed_factor=pack,
        )
        # float32 holds the checkpoint's float16 scales exactly, whatever the model dtype.
        scales = torch.empty(num_groups, out_features, dtype=torch.float32)
        make_param(layer, "scales", scales, input_dim=group_dim, output_dim=1)
        layer.act_dtype = params_dtype

    def process_weights_after_loading(self, layer):
        cfg = self.config
        codes = unpack_int32(layer.qweight.data, cfg.bits, dim=0).t()  # [out, in]
        zeros = unpack_int32(layer.qzeros.data, cfg.bits, dim=1).t()  # [out, groups]
        if cfg.zeros_stored_minus_one:
            zeros = zeros + 1
        if cfg.desc_act:
            g_idx = layer.g_idx.data.to(torch.int64)  # groups of all ranks: scales are whole
        else:  # monotone: this rank's own groups, whatever the checkpoint numbered them
            in_features = codes.shape[1]
            g_idx = torch.arange(in_features, device=codes.device) // (
                in_features if cfg.group_size == -1 else cfg.group_size
            )
        set_int_weight(
            layer,
            ["qweight", "qzeros", "scales", "g_idx"],
            codes,
            layer.scales.data.t(),
            zeros.to(torch.float32),
            g_idx,
            cfg.bits,
            layer.act_dtype,
        )

    def apply(self, layer, x, bias):
        return apply_int_weight(layer, x, bias)
