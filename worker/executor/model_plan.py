"""What the checkpoint and the config decide before any weight loads.

The engine process derives this to validate a start (architecture, context
length, tensor-parallel divisibility) before it spawns a rank; every rank
derives the same from the same config.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shared.errors import ConfigError
from worker.config import EngineConfig
from worker.models.loader import resolve_model_path
from worker.models.registry import get_model_class
from worker.models.spec import ModelSpec
from worker.runner.platform import resolve_dtype, resolve_max_model_len


@dataclass(frozen=True)
class ModelPlan:
    spec: ModelSpec
    dtype: torch.dtype
    max_model_len: int

    @classmethod
    def make(cls, config: EngineConfig, device: torch.device) -> ModelPlan:
        spec = ModelSpec.from_folder(resolve_model_path(config.model.model, config.model.revision))
        get_model_class(spec.architecture)  # unsupported architectures fail before any loading
        check_tensor_parallel(spec, config.parallel.tensor_parallel_size)
        max_model_len = resolve_max_model_len(config.model, spec)
        sched = config.scheduler
        if not sched.enable_chunked_prefill and sched.max_num_batched_tokens < max_model_len:
            raise ConfigError(
                f"--max-num-batched-tokens {sched.max_num_batched_tokens} is below "
                f"--max-model-len {max_model_len}; raise it or enable chunked prefill"
            )
        return cls(spec, resolve_dtype(config.model, spec, device), max_model_len)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def valid_tp_sizes(spec: ModelSpec) -> list[int]:
    """Sizes that split the attention heads and the MLP evenly and either split
    the KV heads evenly or replicate each KV head on the same number of ranks."""
    return [
        size
        for size in _divisors(spec.num_heads)
        if spec.intermediate_size % size == 0
        and (spec.num_kv_heads % size == 0 or size % spec.num_kv_heads == 0)
    ]


def check_tensor_parallel(spec: ModelSpec, tp_size: int) -> None:
    if tp_size in valid_tp_sizes(spec):
        return
    if spec.num_heads % tp_size:
        why = f"its {spec.num_heads} attention heads do not split into {tp_size} equal parts"
    elif spec.intermediate_size % tp_size:
        why = f"its MLP width {spec.intermediate_size} does not split into {tp_size} equal parts"
    else:
        why = (
            f"its {spec.num_kv_heads} KV heads neither split into {tp_size} equal parts "
            f"nor replicate evenly over {tp_size} ranks"
        )
    sizes = ", ".join(map(str, valid_tp_sizes(spec)))
    raise ConfigError(
        f"--tensor-parallel-size {tp_size} does not fit {spec.architecture}: {why}; "
        f"sizes that work: {sizes}"
    )
