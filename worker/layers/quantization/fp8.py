"""vLLM's FP8 checkpoint format, and FP8 at load from a dense checkpoint.

A checkpoint (`quant_method: fp8`) holds per linear `weight` [out, in]
float8_e4m3fn and either `weight_scale` (one float32 per tensor; a fused
layer has one per part) or, with `weight_block_size: [bo, bi]`,
`weight_scale_inv` [ceil(out / bo), ceil(in / bi)]; `activation_scheme:
static` adds `input_scale` per tensor. `--quantization fp8` on a dense
checkpoint quantizes each row at load (scale = max|w| / 448).

Weight-only: activations are never quantized to fp8 (a static `input_scale` is
read and dropped). The CPUs served have no fp8 matmul, so W8A8 would only add
the activations' rounding error; outputs therefore differ from vLLM's FP8
W8A8 on a GPU by that rounding (logged at start).
"""

from __future__ import annotations

import torch

from shared.errors import ConfigError
from shared.logging import get_logger
from worker.layers.quantization.base import (
    LinearMethodBase,
    QuantizationConfig,
    is_layer_skipped,
    make_ignored_param,
    make_param,
    make_per_shard_param,
    whole_input_rows,
)
from worker.layers.quantization.fp8_weight import (
    FP8,
    apply_fp8_weight,
    quantize_fp8_rows,
    set_fp8_weight,
)
from worker.layers.quantization.unquantized import UnquantizedLinearMethod

logger = get_logger(__name__)


class Fp8Config(QuantizationConfig):
    name = "fp8"
    quantizes_at_load = True  # and a checkpoint format

    def __init__(
        self,
        is_checkpoint_fp8: bool,
        static_activations: bool,
        block: tuple[int, int] | None,
        ignored_layers: list[str],
    ) -> None:
        self.is_checkpoint_fp8 = is_checkpoint_fp8
        self.static_activations = static_activations
        self.block = block
        self.ignored_layers = ignored_layers

    @classmethod
    def from_config(cls, config):
        scheme = config.get("activation_scheme", "dynamic")
        if scheme not in ("static", "dynamic"):
            raise ConfigError(
                f"fp8 activation_scheme {scheme!r} is not supported; supported: static, dynamic"
            )
        if config:  # a checkpoint: its activation scheme is not applied
            logger.warning(
                "fp8 checkpoint (activation_scheme %s): activations are not quantized; they "
                "stay in the model's dtype and only the weights are fp8 (weight-only)",
                scheme,
            )
        block = config.get("weight_block_size")
        if block is not None and (len(block) != 2 or min(block) <= 0):
            raise ConfigError(f"fp8 weight_block_size must be two positive sizes, got {block}")
        return cls(
            bool(config),
            scheme == "static",
            tuple(block) if block else None,
            list(config.get("ignored_layers") or config.get("modules_to_not_convert") or []),
        )

    def describe(self):
        origin = "checkpoint" if self.is_checkpoint_fp8 else "quantized at load"
        return f"fp8 weights ({origin})"

    def get_linear_method(self, prefix):
        if is_layer_skipped(prefix, self.ignored_layers, self.packed_modules):
            return UnquantizedLinearMethod()
        if not self.is_checkpoint_fp8:
            return Fp8AtLoadMethod()
        return Fp8LinearMethod(self)


class Fp8LinearMethod(LinearMethodBase):
    def __init__(self, config: Fp8Config) -> None:
        self.config = config

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, params_dtype):
        out_features = sum(output_partition_sizes)
        weight = torch.empty(out_features, input_size_per_partition, dtype=FP8)
        make_param(layer, "weight", weight, input_dim=1, output_dim=0)
        block = self.config.block
        if block is None:
            make_per_shard_param(layer, "weight_scale", len(output_partition_sizes))
        else:
            for size in output_partition_sizes:
                if size % block[0] or input_size_per_partition % block[1]:
                    raise ConfigError(
                        f"{layer.prefix}: a [{size} x {input_size_per_partition}] shard does not "
                        f"divide into fp8 weight blocks of {list(block)}"
                    )
            scale = torch.empty(
                out_features // block[0], input_size_per_partition // block[1], dtype=torch.float32
            )
            make_param(
                layer,
                "weight_scale_inv",
                scale,
                input_dim=1,
                output_dim=0,
                packed_dim=0,
                packed_factor=block[0],
            )
        if self.config.static_activations:
            make_ignored_param(layer, "input_scale", torch.zeros(len(output_partition_sizes)))
        layer.act_dtype = params_dtype

    def process_weights_after_loading(self, layer):
        drop = ["weight", "input_scale"] if self.config.static_activations else ["weight"]
        if self.config.block is None:
            sizes = torch.tensor(layer.output_partition_sizes, device=layer.weight.device)
            rows = layer.weight_scale.data.repeat_interleave(sizes)[:, None]  # [out, 1]
            set_fp8_weight(layer, [*drop, "weight_scale"], layer.weight.data, rows, layer.act_dtype)
        else:
            scales = layer.weight_scale_inv.data
            set_fp8_weight(
                layer,
                [*drop, "weight_scale_inv"],
                layer.weight.data,
                scales,
                layer.act_dtype,
                self.config.block,
            )

    def apply(self, layer, x, bias):
        return apply_fp8_weight(layer, x, bias)


class Fp8AtLoadMethod(UnquantizedLinearMethod):
    def process_weights_after_loading(self, layer):
        dtype = layer.weight.dtype
        weight, columns = whole_input_rows(layer)
        weight, scales = quantize_fp8_rows(weight)  # a scale per whole row
        if columns is not None:
            weight = weight[:, columns]
        set_fp8_weight(layer, ["weight"], weight, scales, dtype)

    def apply(self, layer, x, bias):
        return apply_fp8_weight(layer, x, bias)

    def apply_silu_and_mul(self, layer, x, bias):
        return None
