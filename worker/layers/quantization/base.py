"""The interface every weight format implements for the linear layers.

The linear layer owns shapes, sharding and loading; the method owns how the
weight is stored (dtype, packing, scales) and how `y = x W^T + b` is computed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import nn

from worker.layers.quantization import cpu_packed


class LinearMethodBase(ABC):
    @abstractmethod
    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_size_per_partition: int,
        params_dtype: torch.dtype,
    ) -> None:
        """Register the layer's parameters (at least `weight`)."""

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x: [num_tokens, in_features] -> [num_tokens, out_features]."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:  # noqa: B027
        """Repack loaded weights into the format `apply` wants (optional)."""

    def apply_silu_and_mul(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor | None:
        """silu(gate) * up of a [gate; up] layer in one pass, [num_tokens, 2 d] never
        made: [num_tokens, in_features] -> [num_tokens, d]. None where the format has
        no fused form (the caller applies, then SiluAndMul)."""
        return None


class UnquantizedLinearMethod(LinearMethodBase):
    """Dense weights in the model dtype."""

    def create_weights(
        self, layer, input_size_per_partition, output_size_per_partition, params_dtype
    ):
        # [out_features, in_features], the Hugging Face layout, so loading is a copy.
        weight = nn.Parameter(
            torch.empty(output_size_per_partition, input_size_per_partition, dtype=params_dtype),
            requires_grad=False,
        )
        layer.register_parameter("weight", weight)

    def process_weights_after_loading(self, layer):
        if cpu_packed.can_pack(layer.weight):
            # Replaces the weight: a packed copy beside it would double the memory.
            layer.weight = nn.Parameter(cpu_packed.pack(layer.weight.data), requires_grad=False)
            layer.weight_is_packed = True

    def apply(self, layer, x, bias):
        if getattr(layer, "weight_is_packed", False):
            return cpu_packed.packed_linear(x, layer.weight, bias)
        return F.linear(x, layer.weight, bias)

    def apply_silu_and_mul(self, layer, x, bias):
        if getattr(layer, "weight_is_packed", False):
            return cpu_packed.packed_linear_silu(x, layer.weight, bias)
        return None
