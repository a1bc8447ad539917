"""How many KV blocks fit, decided once at start-up and reported to the operator."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from shared.errors import ConfigError
from shared.logging import get_logger
from worker.config import CacheConfig
from worker.meminfo import meminfo
from worker.models.spec import ModelSpec
from worker.runner.gpu_memory import GPUMemoryProfile

logger = get_logger(__name__)
_GPU_UTILIZATION_DEFAULT = next(
    f.default for f in dataclasses.fields(CacheConfig) if f.name == "gpu_memory_utilization"
)

_CPU_DEFAULT_FRACTION = 0.5
# On CPU the KV cache shares RAM with everything else on the machine (and with
# sibling workers), so an unset size is also capped, as vLLM's CPU build does.
_CPU_DEFAULT_CAP = 4 * 2**30


def available_memory(device: torch.device) -> int:
    """Bytes free for new allocations on `device` right now."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    return meminfo()[1]


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.2f} GiB"


@dataclass(frozen=True)
class KVBudget:
    weights_bytes: int
    bytes_per_block: int
    num_blocks: int
    block_size: int
    max_model_len: int
    gpu_profile: GPUMemoryProfile | None = None
    kv_dtype: str = ""

    @property
    def kv_bytes(self) -> int:
        return self.bytes_per_block * self.num_blocks

    @property
    def max_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        """Requests of --max-model-len tokens that fit at once."""
        return self.max_tokens / self.max_model_len

    def describe(self) -> str:
        line = (
            f"weights {_gib(self.weights_bytes)}; KV cache{self.kv_dtype} {_gib(self.kv_bytes)} = "
            f"{self.num_blocks} blocks x {self.block_size} tokens = {self.max_tokens} tokens; "
            f"{self.max_concurrency:.2f} concurrent requests at max-model-len {self.max_model_len}"
        )
        return line if self.gpu_profile is None else f"{line}; {self.gpu_profile.describe()}"


def plan_kv_cache(
    cache: CacheConfig,
    spec: ModelSpec,
    dtype: torch.dtype,
    device: torch.device,
    weights_bytes: int,
    max_model_len: int,
    tp_size: int = 1,
    gpu_profile: GPUMemoryProfile | None = None,
    num_local_ranks: int = 1,
) -> KVBudget:
    """One rank's cache (its own KV heads). gpu_profile: on a GPU, the start-up
    profile (gpu_memory.py); it sizes the cache unless --num-kv-blocks or
    --kv-cache-memory does. num_local_ranks: ranks sharing this machine's RAM,
    which split the CPU default between them."""
    if device.type == "cpu" and cache.gpu_memory_utilization != _GPU_UTILIZATION_DEFAULT:
        logger.warning(
            "--gpu-memory-utilization sizes a GPU's memory and does nothing on CPU; here "
            "--kv-cache-memory (e.g. 4GiB, vLLM's VLLM_CPU_KVCACHE_SPACE) or "
            "--kv-cache-memory-fraction sizes the KV cache"
        )
    bytes_per_block = cache.block_size * spec.kv_bytes_per_token(dtype, tp_size)
    if cache.num_kv_blocks is not None:
        num_blocks = cache.num_kv_blocks
    elif cache.kv_cache_memory is not None:
        num_blocks = cache.kv_cache_memory // bytes_per_block
    elif gpu_profile is not None:
        if cache.kv_cache_memory_fraction is not None:
            raise ConfigError(
                "--kv-cache-memory-fraction sizes the KV cache on CPU; on a GPU use "
                "--gpu-memory-utilization (or --kv-cache-memory)"
            )
        gpu_profile.check()
        num_blocks = gpu_profile.kv_bytes // bytes_per_block
    else:
        fraction = cache.kv_cache_memory_fraction or _CPU_DEFAULT_FRACTION
        kv_bytes = int(available_memory(device) * fraction)
        if device.type == "cpu" and cache.kv_cache_memory_fraction is None:
            kv_bytes = min(kv_bytes, _CPU_DEFAULT_CAP)
        if device.type == "cpu":
            kv_bytes //= num_local_ranks
        num_blocks = kv_bytes // bytes_per_block
    budget = KVBudget(
        weights_bytes,
        bytes_per_block,
        num_blocks,
        cache.block_size,
        max_model_len,
        gpu_profile,
        "" if cache.kv_cache_dtype == "auto" else f" ({cache.kv_cache_dtype})",
    )
    needed_blocks = -(-max_model_len // cache.block_size)
    if num_blocks < needed_blocks:
        fit_len = num_blocks * cache.block_size
        raise ConfigError(
            f"the KV cache holds {budget.max_tokens} tokens ({num_blocks} blocks of "
            f"{cache.block_size}), less than one request of --max-model-len {max_model_len}. "
            f"Give it at least --kv-cache-memory {needed_blocks * bytes_per_block} "
            f"({_gib(needed_blocks * bytes_per_block)}), or lower --max-model-len to {fit_len} or less."
        )
    return budget
