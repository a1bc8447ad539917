"""Linear layers with Megatron-style tensor-parallel sharding.

Each layer owns its shapes and how a checkpoint tensor is sliced into its
shard (`weight_loader`); the quantization method owns the storage format.
Parameters carry `output_dim` / `input_dim` attributes naming which of their
dims is sharded, so a quantization method's own parameters load the same way.
"""

from __future__ import annotations

import torch
from torch import nn

from worker.distributed import divide, get_tp_rank, get_tp_size, tp_all_reduce
from worker.layers.quantization import (
    LinearMethodBase,
    QuantizationConfig,
    UnquantizedLinearMethod,
)
from worker.models.checkpoint_slice import materialize


def _narrow(loaded: torch.Tensor, dim: int | None, start: int, size: int) -> torch.Tensor:
    # `loaded` may be a CheckpointSlice: narrow() reads only this rank's part.
    return materialize(loaded) if dim is None else loaded.narrow(dim, start, size)


def _load_replicated(param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int) -> None:
    """A parameter the fused parts share whole (GPTQ's g_idx): the first part
    loaded writes it, the others must agree."""
    loaded = materialize(loaded)
    if not getattr(param, "is_loaded", False):
        param.data.copy_(loaded)
        param.is_loaded = True
    elif not torch.equal(param.data, loaded.to(param.dtype)):
        raise ValueError(f"fused parts disagree on a shared tensor (part {shard_id!r})")


def _stored(param: nn.Parameter, dim: int, features: int) -> int:
    """Features along `dim` -> stored elements (8 int4 codes share one int32)."""
    if getattr(param, "packed_dim", None) == dim:
        return features // param.packed_factor
    return features


class LinearBase(nn.Module):
    """y = x W^T + b with W stored by a quantization method.

    `prefix` is the module's name in the model (`model.layers.0.mlp.down_proj`):
    the quantization config picks the method by it.
    """

    def __init__(
        self,
        input_size: int,
        output_size: int,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        bias: bool,
        quant_config: QuantizationConfig | None,
        prefix: str,
        params_dtype: torch.dtype | None,
    ) -> None:
        super().__init__()
        params_dtype = params_dtype or torch.get_default_dtype()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.input_size, self.output_size = input_size, output_size
        self.input_size_per_partition = input_size_per_partition
        self.output_partition_sizes = output_partition_sizes
        self.prefix = prefix
        self.quant_method: LinearMethodBase = (
            UnquantizedLinearMethod()
            if quant_config is None
            else quant_config.get_linear_method(prefix)
        )
        self.quant_method.create_weights(
            self, input_size_per_partition, output_partition_sizes, params_dtype
        )
        if bias:
            self.bias = nn.Parameter(
                torch.empty(sum(output_partition_sizes), dtype=params_dtype), requires_grad=False
            )
            self.bias.output_dim, self.bias.input_dim = 0, None
        else:
            self.register_parameter("bias", None)
        for param in self.parameters(recurse=False):
            # A method's own loader (per-shard scales) stays; the rest slice here.
            if not hasattr(param, "weight_loader"):
                param.weight_loader = self.weight_loader

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        param.data.copy_(materialize(loaded))

    def process_weights_after_loading(self) -> None:
        self.quant_method.process_weights_after_loading(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)


class ReplicatedLinear(LinearBase):
    def __init__(
        self, input_size, output_size, bias=False, quant_config=None, prefix="", params_dtype=None
    ):
        super().__init__(
            input_size,
            output_size,
            input_size,
            [output_size],
            bias,
            quant_config,
            prefix,
            params_dtype,
        )


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks; each rank keeps its slice of the output."""

    def __init__(
        self,
        input_size,
        output_size,
        bias=False,
        quant_config=None,
        prefix="",
        params_dtype=None,
        output_partition_sizes=None,
    ):
        self.output_size_per_partition = divide(
            output_size, get_tp_size(), "output features of a column-parallel linear"
        )
        super().__init__(
            input_size,
            output_size,
            input_size,
            output_partition_sizes or [self.output_size_per_partition],
            bias,
            quant_config,
            prefix,
            params_dtype,
        )

    def weight_loader(self, param, loaded, shard_id=None):
        dim = getattr(param, "output_dim", None)
        size = param.shape[dim] if dim is not None else 0
        param.data.copy_(_narrow(loaded, dim, self.tp_rank * size, size))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs stored as one matrix (e.g. gate_up_proj).

    Checkpoint tensors arrive one shard at a time (shard_id = index into
    `output_sizes`) and land in their slice of each rank's partition.
    """

    def __init__(
        self, input_size, output_sizes, bias=False, quant_config=None, prefix="", params_dtype=None
    ):
        self.output_sizes = list(output_sizes)
        tp_size = get_tp_size()
        super().__init__(
            input_size,
            sum(output_sizes),
            bias,
            quant_config,
            prefix,
            params_dtype,
            [divide(size, tp_size, "output features of a merged linear") for size in output_sizes],
        )

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """silu(gate) * up of a [gate, up] layer in one pass, where its weight
        format fuses them: [num_tokens, in] -> [num_tokens, gate size]; else None."""
        if len(self.output_sizes) != 2 or self.output_sizes[0] != self.output_sizes[1]:
            return None
        return self.quant_method.apply_silu_and_mul(self, x, self.bias)

    def weight_loader(self, param, loaded, shard_id=None):
        if shard_id is None:
            return super().weight_loader(param, loaded)
        dim = param.output_dim
        if dim is None:
            return _load_replicated(param, loaded, shard_id)
        size = _stored(param, dim, self.output_sizes[shard_id] // self.tp_size)
        offset = _stored(param, dim, sum(self.output_sizes[:shard_id]) // self.tp_size)
        shard = loaded.narrow(dim, self.tp_rank * size, size)
        param.data.narrow(dim, offset, size).copy_(shard)


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections fused into one matrix, sharded by heads.

    When there are more ranks than KV heads, each KV head is replicated on
    tp_size / num_kv_heads ranks.
    """

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        total_num_heads: int,
        total_num_kv_heads: int,
        bias: bool = False,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        params_dtype: torch.dtype | None = None,
    ) -> None:
        tp_size = get_tp_size()
        self.head_dim = head_dim
        self.num_heads = divide(total_num_heads, tp_size, "number of attention heads")
        if tp_size >= total_num_kv_heads:
            self.num_kv_heads = 1
            self.kv_replicas = divide(
                tp_size, total_num_kv_heads, "tensor-parallel size over KV heads"
            )
        else:
            self.num_kv_heads = divide(total_num_kv_heads, tp_size, "number of KV heads")
            self.kv_replicas = 1
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim
        output_size = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp_size
        super().__init__(
            hidden_size,
            output_size,
            bias,
            quant_config,
            prefix,
            params_dtype,
            [self.q_size, self.kv_size, self.kv_size],
        )

    def weight_loader(self, param, loaded, shard_id=None):
        if shard_id is None:
            raise ValueError("qkv_proj loads from separate q_proj, k_proj and v_proj tensors")
        dim = param.output_dim
        if dim is None:
            return _load_replicated(param, loaded, shard_id)
        if shard_id == "q":
            offset, size, start = 0, self.q_size, self.tp_rank * self.q_size
        else:
            offset = self.q_size if shard_id == "k" else self.q_size + self.kv_size
            size, start = self.kv_size, (self.tp_rank // self.kv_replicas) * self.kv_size
        offset, size, start = (_stored(param, dim, n) for n in (offset, size, start))
        param.data.narrow(dim, offset, size).copy_(loaded.narrow(dim, start, size))


class RowParallelLinear(LinearBase):
    """Input features split across ranks; partial outputs are summed."""

    def __init__(
        self,
        input_size,
        output_size,
        bias=False,
        reduce_results=True,
        quant_config=None,
        prefix="",
        params_dtype=None,
    ):
        self.reduce_results = reduce_results
        input_per_partition = divide(
            input_size, get_tp_size(), "input features of a row-parallel linear"
        )
        super().__init__(
            input_size,
            output_size,
            input_per_partition,
            [output_size],
            bias,
            quant_config,
            prefix,
            params_dtype,
        )

    def weight_loader(self, param, loaded, shard_id=None):
        dim = getattr(param, "input_dim", None)
        size = param.shape[dim] if dim is not None else 0
        param.data.copy_(_narrow(loaded, dim, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Bias is added once, after the sum, not on every rank.
        out = self.quant_method.apply(self, x, None)
        if self.reduce_results:
            out = tp_all_reduce(out)
        return out if self.bias is None else out + self.bias
