"""A checkpoint tensor not read yet: a weight loader reads only the part it keeps.

Under tensor parallelism each rank narrows every sharded tensor to its own
slice; reading through safetensors' `get_slice` means no rank ever holds the
whole model, only its shard (plus the replicated norms) and one slice in flight.
"""

from __future__ import annotations

import torch

# Bytes this process has read through slices (a rank's share of the checkpoint).
bytes_read = 0


def _counted(tensor: torch.Tensor) -> torch.Tensor:
    global bytes_read
    bytes_read += tensor.numel() * tensor.element_size()
    return tensor


class CheckpointSlice:
    """Tensor-like enough for weight loaders: `shape`, `narrow`, `materialize`."""

    def __init__(self, handle, name: str) -> None:
        self._slice = handle.get_slice(name)
        self.name = name
        self.shape = torch.Size(self._slice.get_shape())

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        """Read rows [start, start + length) of `dim`, and nothing else."""
        dim = dim % len(self.shape)
        index = [slice(None)] * len(self.shape)
        index[dim] = slice(start, start + length)
        return _counted(self._slice[tuple(index)])

    def materialize(self) -> torch.Tensor:
        return _counted(self._slice[:])

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return len(self.shape)


def materialize(loaded: torch.Tensor | CheckpointSlice) -> torch.Tensor:
    """The whole tensor, read now if it was not yet."""
    return loaded.materialize() if isinstance(loaded, CheckpointSlice) else loaded
