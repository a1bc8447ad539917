"""The interfaces every weight format implements for the linear layers.

A `QuantizationConfig` is what a checkpoint's `quantization_config` (or the
`--quantization` flag) says; it hands each linear layer, by its module prefix,
a `LinearMethodBase`. The linear layer owns shapes, sharding and loading; the
method owns how the weight is stored (dtype, packing, scales) and how
`y = x W^T + b` is computed.

Methods register their parameters under the checkpoint's own names and tag
each with the dims the layer's `weight_loader` slices for tensor parallelism:
`output_dim` / `input_dim` (None: not sharded along it), and `packed_dim` /
`packed_factor` where several values share one stored element (8 int4 codes
per int32), so shard offsets given in features are divided down.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
from torch import nn

from shared.errors import ConfigError
from worker.distributed import tp_all_gather
from worker.models.checkpoint_slice import materialize


class LinearMethodBase(ABC):
    @abstractmethod
    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        params_dtype: torch.dtype,
    ) -> None:
        """Register the layer's parameters. `output_partition_sizes` are this
        rank's output features per logical shard ([q, k, v], [gate, up] or one);
        `layer.input_size` / `layer.output_size` are the unsharded sizes."""

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


class QuantizationConfig(ABC):
    """One quantization format, as a checkpoint's `quantization_config` gives it."""

    name: ClassVar[str]
    # True for formats made at load from a dense checkpoint (int8, int4, fp8 on
    # the fly): they need no quantization_config and refuse a quantized checkpoint.
    quantizes_at_load: ClassVar[bool] = False
    # Fused layer -> the checkpoint modules it holds ({"qkv_proj": ["q_proj", ...]}),
    # set from the model's packed_modules_mapping before its layers are built.
    packed_modules: dict[str, list[str]] = {}  # noqa: RUF012 (replaced, never mutated)

    @classmethod
    @abstractmethod
    def from_config(cls, config: dict[str, Any]) -> QuantizationConfig:
        """Parse a checkpoint's quantization_config ({} on the fly); a value the
        engine cannot serve raises ConfigError naming it and what is supported."""

    @abstractmethod
    def get_linear_method(self, prefix: str) -> LinearMethodBase:
        """The method for the linear layer at `prefix` (e.g.
        `model.layers.0.self_attn.qkv_proj`)."""

    def describe(self) -> str:
        return self.name


def make_param(
    layer: nn.Module,
    name: str,
    data: torch.Tensor,
    *,
    input_dim: int | None = None,
    output_dim: int | None = None,
    packed_dim: int | None = None,
    packed_factor: int = 1,
) -> nn.Parameter:
    """Register `data` as `layer.<name>` with its sharding tags."""
    param = nn.Parameter(data, requires_grad=False)
    param.input_dim, param.output_dim = input_dim, output_dim
    param.packed_dim, param.packed_factor = packed_dim, packed_factor
    layer.register_parameter(name, param)
    return param


def shard_index(shard_id: str | int | None) -> int:
    """The logical shard a fused layer's checkpoint part fills: q/k/v -> 0/1/2,
    gate/up -> 0/1, an unfused layer's one tensor -> 0."""
    if shard_id is None:
        return 0
    return {"q": 0, "k": 1, "v": 2}.get(shard_id, shard_id)


def make_per_shard_param(layer: nn.Module, name: str, num_shards: int) -> nn.Parameter:
    """A float32 [num_shards] parameter holding one scalar per checkpoint part
    (per-tensor scales), the same on every rank."""
    param = make_param(layer, name, torch.zeros(num_shards, dtype=torch.float32))

    def load(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        # materialize: under tensor parallelism `loaded` is an unread CheckpointSlice.
        param.data[shard_index(shard_id)] = materialize(loaded).reshape(()).to(torch.float32)

    param.weight_loader = load
    return param


def make_ignored_param(layer: nn.Module, name: str, data: torch.Tensor) -> nn.Parameter:
    """A checkpoint tensor the method reads nothing from (compressed-tensors'
    weight_shape, activation scales of a weight-only path): loaded, then dropped."""
    param = make_param(layer, name, data)
    param.weight_loader = lambda param, loaded, shard_id=None: None
    return param


def replace_params(layer: nn.Module, drop: list[str], **tensors: torch.Tensor) -> None:
    """Swap checkpoint-format parameters for the repacked ones `apply` reads."""
    for name in drop:
        delattr(layer, name)
    for name, tensor in tensors.items():
        if tensor is None:
            setattr(layer, name, None)
        else:
            layer.register_parameter(name, nn.Parameter(tensor, requires_grad=False))


def expand_packed_names(prefix: str, packed_modules: dict[str, list[str]]) -> list[str]:
    """`...qkv_proj` -> [`...q_proj`, `...k_proj`, `...v_proj`]: the checkpoint's
    names for a fused layer, as a format's ignore list names them."""
    head, _, last = prefix.rpartition(".")
    parts = packed_modules.get(last)
    if not parts:
        return [prefix]
    return [f"{head}.{part}" if head else part for part in parts]


def is_layer_skipped(
    prefix: str, unconverted: list[str], packed_modules: dict[str, list[str]]
) -> bool:
    """Whether the format leaves this layer dense (`modules_to_not_convert`,
    `ignore`). Entries match a module name or any dotted part of it, as the
    tools that write them do; `re:` entries are regular expressions
    (compressed-tensors). A fused layer is skipped only if all its parts are."""
    import re

    def skipped(name: str) -> bool:
        for entry in unconverted:
            if entry.startswith("re:"):
                if re.match(entry[3:], name):
                    return True
            elif name == entry or name.endswith("." + entry) or f".{entry}." in f".{name}.":
                return True
        return False

    parts = [skipped(name) for name in expand_packed_names(prefix, packed_modules)]
    if any(parts) and not all(parts):
        raise ConfigError(
            f"{prefix}: the checkpoint quantizes some of its fused parts and not others; "
            "the engine needs all or none of them converted"
        )
    return all(parts)


def whole_input_rows(layer: nn.Module) -> tuple[torch.Tensor, slice | None]:
    """The layer's dense weight [out, in] over every input feature, and which of
    those columns this rank keeps (None: all of them).

    Quantizing at load takes statistics over whole rows (a row's max, a group of
    128 inputs); a row-parallel rank holds only its slice of the inputs, so it
    gathers the rows (one layer at a time, at load) and quantizes exactly as
    tensor-parallel size 1 does, then keeps its own columns.
    """
    weight = layer.weight.data
    if layer.input_size_per_partition == layer.input_size:
        return weight, None
    start = layer.tp_rank * layer.input_size_per_partition
    return tp_all_gather(weight, dim=1), slice(start, start + layer.input_size_per_partition)
