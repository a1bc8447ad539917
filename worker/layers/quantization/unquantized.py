"""Dense weights in the model dtype: the method every layer gets by default."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from worker.layers import cpu_half_f32, cpu_packed
from worker.layers.quantization.base import LinearMethodBase, make_param


class UnquantizedLinearMethod(LinearMethodBase):
    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, params_dtype):
        # [out_features, in_features], the Hugging Face layout, so loading is a copy.
        weight = torch.empty(
            sum(output_partition_sizes), input_size_per_partition, dtype=params_dtype
        )
        make_param(layer, "weight", weight, input_dim=1, output_dim=0)

    def process_weights_after_loading(self, layer):
        half = cpu_half_f32.pack_if_lossless(layer.weight.data)
        if half is not None:  # float32 compute over half storage (CPUs without fast bf16)
            layer.weight_f32 = cpu_half_f32.float32_copy(layer.weight.data)  # or None
            layer.weight = nn.Parameter(half, requires_grad=False)
            layer.weight_is_half_f32 = True
        elif cpu_packed.can_pack(layer.weight):
            # Replaces the weight: a packed copy beside it would double the memory.
            layer.weight = nn.Parameter(cpu_packed.pack(layer.weight.data), requires_grad=False)
            layer.weight_is_packed = True

    def apply(self, layer, x, bias):
        if getattr(layer, "weight_is_half_f32", False):
            return cpu_half_f32.half_linear(x, layer.weight, bias, layer.weight_f32)
        if getattr(layer, "weight_is_packed", False):
            return cpu_packed.packed_linear(x, layer.weight, bias)
        return F.linear(x, layer.weight, bias)

    def apply_silu_and_mul(self, layer, x, bias):
        if getattr(layer, "weight_is_half_f32", False):
            return cpu_half_f32.half_linear_silu(x, layer.weight, bias, layer.weight_f32)
        if getattr(layer, "weight_is_packed", False):
            return cpu_packed.packed_linear_silu(x, layer.weight, bias)
        return None
