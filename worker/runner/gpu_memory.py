"""GPU memory sizing for --gpu-memory-utilization, as vLLM means it: this
worker may use that fraction of the device's total memory, counting only what
it uses itself, so several workers sharing one GPU each take their own
fraction and do not race for whatever happens to be free.

    budget = total x utilization
    KV cache = budget - weights - activation peak - non-torch memory
               (activation peak: one forward of --max-num-batched-tokens tokens
                and the sampler, profiled at start; non-torch: what the CUDA
                context, cuBLAS and NCCL grew by while this worker loaded)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shared.errors import ConfigError


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.2f} GiB"


@dataclass(frozen=True)
class MemorySnapshot:
    free: int
    total: int
    torch_reserved: int  # what torch's caching allocator holds

    @classmethod
    def take(cls, device: torch.device) -> MemorySnapshot:
        torch.cuda.synchronize(device)
        free, total = torch.cuda.mem_get_info(device)
        return cls(free, total, torch.cuda.memory_reserved(device))

    @property
    def non_torch(self) -> int:
        """Device memory in use that torch's allocator does not hold."""
        return self.total - self.free - self.torch_reserved


def check_startup_memory(snapshot: MemorySnapshot, utilization: float) -> None:
    """A worker starting where less than its share is free fails now, with numbers."""
    wanted = int(snapshot.total * utilization)
    if snapshot.free < wanted:
        raise ConfigError(
            f"--gpu-memory-utilization {utilization} asks for {_gib(wanted)} of the GPU's "
            f"{_gib(snapshot.total)}, but only {_gib(snapshot.free)} is free (other processes "
            "hold the rest): lower --gpu-memory-utilization or free GPU memory"
        )


@dataclass(frozen=True)
class GPUMemoryProfile:
    total: int
    utilization: float
    weights_bytes: int
    activation_peak: int
    non_torch_bytes: int

    @property
    def budget(self) -> int:
        return int(self.total * self.utilization)

    @property
    def kv_bytes(self) -> int:
        return self.budget - self.weights_bytes - self.activation_peak - self.non_torch_bytes

    def describe(self) -> str:
        return (
            f"--gpu-memory-utilization {self.utilization}: {_gib(self.budget)} of "
            f"{_gib(self.total)}; activation peak {_gib(self.activation_peak)}, "
            f"non-torch {_gib(self.non_torch_bytes)}"
        )

    def check(self) -> None:
        if self.kv_bytes <= 0:
            raise ConfigError(
                f"no memory is left for the KV cache: {self.describe()}, weights "
                f"{_gib(self.weights_bytes)}; raise --gpu-memory-utilization or lower "
                "--max-num-batched-tokens"
            )
