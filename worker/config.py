"""Engine configuration: frozen groups, validated on construction.

Every field is one CLI flag (see `shared.cli_args`); flag names follow vLLM
where the concept is the same. Values derived at start-up (the resolved
dtype, the number of KV blocks) are returned by the code that derives them
and passed on; they are never written back here.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from shared.cli_args import add_dataclass_args, dataclass_from_args, parse_bytes
from shared.cpu_cores import parse_core_list
from shared.errors import ConfigError
from shared.sampling_params import MAX_LOGPROBS

DTYPES = ("auto", "bfloat16", "float16", "float32")
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "float32", "fp8", "fp8_e4m3")


def _positive(name: str, value: int | float | None) -> None:
    if value is not None and value <= 0:
        raise ConfigError(f"--{name.replace('_', '-')} must be > 0, got {value}")


@dataclass(frozen=True)
class ModelConfig:
    model: str = field(metadata={"help": "Hugging Face model id or local checkpoint folder."})
    tokenizer: str | None = field(
        default=None, metadata={"help": "Tokenizer folder or id (default: the model's)."}
    )
    revision: str | None = field(default=None, metadata={"help": "Hub revision to download."})
    dtype: str = field(
        default="auto",
        metadata={
            "help": "Weight and activation dtype. auto: the checkpoint's half-precision "
            "dtype on GPU (bf16 for float32 checkpoints); on CPU bf16 for half-precision "
            "checkpoints where the CPU has native bf16 (AVX512-BF16/AMX), else float32.",
            "choices": DTYPES,
        },
    )
    max_model_len: int | None = field(
        default=None,
        metadata={"help": "Longest prompt + output, in tokens (default: the model's)."},
    )
    quantization: str | None = field(
        default=None,
        metadata={
            "help": "Weight quantization (vLLM's names). Default: the checkpoint's own "
            "(config.json quantization_config: gptq, awq, fp8, compressed-tensors); from a "
            "dense checkpoint, quantize at load: int8 (per channel), int4 (groups of 128), "
            "fp8, bitsandbytes (NF4)."
        },
    )
    seed: int = field(default=0, metadata={"help": "Seed for requests that set none."})
    served_model_name: str | None = field(
        default=None, metadata={"help": "Name clients use for the model (default: --model)."}
    )
    max_logprobs: int = field(
        default=MAX_LOGPROBS,
        metadata={
            "help": "Most logprobs (and prompt logprobs) a request may ask for per position "
            f"(vLLM's flag; at most {MAX_LOGPROBS})."
        },
    )
    generation_config: str = field(
        default="auto",
        metadata={
            "help": "Sampling defaults for requests that leave them unset. auto: the model's "
            "generation_config.json (temperature, top_p, top_k, min_p, repetition_penalty, "
            "max_new_tokens); vllm: the engine's own defaults; else a folder holding a "
            "generation_config.json."
        },
    )

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        _positive("max_model_len", self.max_model_len)
        if not 0 <= self.max_logprobs <= MAX_LOGPROBS:
            raise ConfigError(
                f"--max-logprobs must be in [0, {MAX_LOGPROBS}] (Pagoda's limit, vLLM's "
                f"default), got {self.max_logprobs}"
            )

    @property
    def name(self) -> str:
        return self.served_model_name or self.model


# Default tokens per KV block. On CPU, 8 halves the half-empty last block of every
# request (KV waste on the `mixed` benchmark: 4.2% at 16, 2.0% at 8) at no
# measured cost in speed; GPU kernels want 16-token tiles.
CPU_BLOCK_SIZE = 8
GPU_BLOCK_SIZE = 16


@dataclass(frozen=True)
class CacheConfig:
    block_size: int | None = field(
        default=None,
        metadata={
            "help": f"Tokens per KV cache block (default {CPU_BLOCK_SIZE} on CPU, "
            f"{GPU_BLOCK_SIZE} on GPU)."
        },
    )
    kv_cache_memory: int | None = field(
        default=None,
        metadata={
            "help": "KV cache size in bytes, e.g. 4GiB (per rank under tensor parallelism).",
            "parse": parse_bytes,
        },
    )
    kv_cache_dtype: str = field(
        default="auto",
        metadata={
            "help": "KV cache dtype. auto: the model dtype, except that a bf16/fp16 checkpoint "
            "run in float32 on a CPU without native bf16 (--dtype auto) keeps its K/V in the "
            "checkpoint's dtype, as it keeps its linear weights (half the bytes decode attention "
            "reads), on the cpu and torch backends; bfloat16 / float16: that, under a "
            "float32 model on the cpu and torch backends (or the model's own dtype); "
            "float32: the model's when it is float32; fp8 (= fp8_e4m3): e4m3 with a "
            "per-tensor scale per layer (the checkpoint's k_scale / v_scale, else 1.0 as "
            "in vLLM), values saturating at +-448: half a bf16 cache's bytes per token, on "
            "every attention backend.",
            "choices": KV_CACHE_DTYPES,
        },
    )
    kv_cache_memory_fraction: float | None = field(
        default=None,
        metadata={
            "help": "CPU: fraction of the memory free after loading weights to give the KV "
            "cache when --kv-cache-memory is not set (default 0.5, capped at 4 GiB unless "
            "this flag is given). On GPU, --gpu-memory-utilization sizes it."
        },
    )
    gpu_memory_utilization: float = field(
        default=0.9,
        metadata={
            "help": "GPU: the fraction of the device's total memory this worker may use "
            "(weights, activations and KV cache; vLLM's meaning). Workers sharing a GPU each "
            "take their own fraction."
        },
    )
    num_kv_blocks: int | None = field(
        default=None, metadata={"help": "Exact number of KV blocks (overrides sizing)."}
    )
    enable_prefix_caching: bool = field(
        default=True, metadata={"help": "Share KV blocks of common prompt prefixes."}
    )

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                f"got {self.kv_cache_dtype!r}"
            )
        _positive("block_size", self.block_size)
        _positive("kv_cache_memory", self.kv_cache_memory)
        _positive("num_kv_blocks", self.num_kv_blocks)
        frac = self.kv_cache_memory_fraction
        if frac is not None and not 0 < frac <= 1:
            raise ConfigError(f"--kv-cache-memory-fraction must be in (0, 1], got {frac}")
        util = self.gpu_memory_utilization
        if not 0 < util <= 1:
            raise ConfigError(f"--gpu-memory-utilization must be in (0, 1], got {util}")


# Default step budgets, as vLLM's CPU build chooses them: offline generation
# wants throughput (bigger prefill chunks), a serving worker also bounds how
# long one step delays every stream's next token.
OFFLINE_STEP_BUDGET = 4096
SERVING_STEP_BUDGET = 2048


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int | None = field(
        default=None,
        metadata={
            "help": f"Token budget of one engine step (default {OFFLINE_STEP_BUDGET} offline: "
            f"the LLM API, `pagoda generate`, `pagoda bench offline`; {SERVING_STEP_BUDGET} "
            "in a serving worker)."
        },
    )
    max_num_seqs: int = field(default=256, metadata={"help": "Most requests running at once."})
    enable_chunked_prefill: bool = field(
        default=True, metadata={"help": "Split long prompts across steps."}
    )
    scheduling_policy: str = field(
        default="fcfs",
        metadata={
            "help": "fcfs, or priority (lower value first, ties by arrival).",
            "choices": ("fcfs", "priority"),
        },
    )

    def __post_init__(self) -> None:
        _positive("max_num_batched_tokens", self.max_num_batched_tokens)
        _positive("max_num_seqs", self.max_num_seqs)
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ConfigError(
                f"--scheduling-policy must be fcfs or priority, got {self.scheduling_policy!r}"
            )


DEFAULT_MASTER_PORT = 29501


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = field(
        default=1,
        metadata={
            "help": "Ranks to shard each layer across (Megatron-style): GPUs, or on CPU "
            "disjoint groups of this worker's cores.",
            "aliases": ("-tp",),
        },
    )
    nnodes: int = field(default=1, metadata={"help": "Machines the tensor-parallel group spans."})
    node_rank: int = field(
        default=0,
        metadata={
            "help": "This machine's index among --nnodes (0 runs the scheduler and serves; "
            "the others only run their ranks)."
        },
    )
    master_addr: str = field(
        default="127.0.0.1",
        metadata={"help": "Address of node 0, where the ranks meet (torch.distributed)."},
    )
    master_port: int | None = field(
        default=None,
        metadata={
            "help": f"Port on --master-addr where the ranks meet (default: a free port on "
            f"one node, {DEFAULT_MASTER_PORT} across nodes). Across nodes, node 0 also "
            "listens on the next port up to relay each step: open both."
        },
    )

    def __post_init__(self) -> None:
        _positive("tensor_parallel_size", self.tensor_parallel_size)
        _positive("nnodes", self.nnodes)
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"--node-rank must be in [0, {self.nnodes}), got {self.node_rank}")
        if self.tensor_parallel_size % self.nnodes:
            raise ConfigError(
                f"--tensor-parallel-size {self.tensor_parallel_size} does not split evenly "
                f"over --nnodes {self.nnodes}"
            )

    @property
    def ranks_per_node(self) -> int:
        return self.tensor_parallel_size // self.nnodes


@dataclass(frozen=True)
class DeviceConfig:
    device: str = field(
        default="auto", metadata={"help": "auto, cpu or cuda.", "choices": ("auto", "cpu", "cuda")}
    )
    cpu_threads: int | None = field(
        default=None,
        metadata={"help": "Threads for CPU compute (default: one per core this worker may use)."},
    )
    cpu_cores: str | None = field(
        default=None,
        metadata={
            "help": "CPU cores this worker runs on, as a Linux cpulist (e.g. 0-3,8); every "
            "thread is pinned there (default: all this process may use; pagoda serve gives "
            "each worker its own)."
        },
    )
    enforce_eager: bool = field(
        default=False,
        metadata={
            "help": "Run every step eagerly: no CUDA graphs for decode steps on a GPU "
            "(on CPU steps always run eagerly)."
        },
    )
    attention_backend: str | None = field(
        default=None, metadata={"help": "Attention backend by name (default: best for device)."}
    )

    def __post_init__(self) -> None:
        _positive("cpu_threads", self.cpu_threads)
        if self.cpu_cores is not None:
            try:
                parse_core_list(self.cpu_cores)
            except ValueError as exc:
                raise ConfigError(f"--cpu-cores: {exc}") from None


_GROUPS = {
    "model": ModelConfig,
    "cache": CacheConfig,
    "scheduler": SchedulerConfig,
    "parallel": ParallelConfig,
    "device": DeviceConfig,
}


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """Build from flat keyword arguments named like the CLI flags."""
        groups: dict[str, dict[str, Any]] = {name: {} for name in _GROUPS}
        for key, value in kwargs.items():
            for group, group_cls in _GROUPS.items():
                if key in {f.name for f in dataclasses.fields(group_cls)}:
                    groups[group][key] = value
                    break
            else:
                raise ConfigError(f"unknown engine option {key!r}")
        return cls(**{name: _GROUPS[name](**values) for name, values in groups.items()})

    def resolved(self, offline: bool, device_type: str) -> EngineConfig:
        """This config with the usage- and device-dependent defaults filled in: the
        step budget (offline or serving) and the block size (CPU or GPU)."""
        config = self
        if config.scheduler.max_num_batched_tokens is None:
            budget = OFFLINE_STEP_BUDGET if offline else SERVING_STEP_BUDGET
            scheduler = dataclasses.replace(config.scheduler, max_num_batched_tokens=budget)
            config = dataclasses.replace(config, scheduler=scheduler)
        if config.cache.block_size is None:
            size = CPU_BLOCK_SIZE if device_type == "cpu" else GPU_BLOCK_SIZE
            config = dataclasses.replace(
                config, cache=dataclasses.replace(config.cache, block_size=size)
            )
        return config

    @staticmethod
    def group_classes() -> tuple[type, ...]:
        return tuple(_GROUPS.values())

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser, positional_model: bool = True) -> None:
        """One flag per field of every group; MODEL positional unless told otherwise."""
        if positional_model:
            parser.add_argument("model", help="Hugging Face model id or checkpoint folder.")
        for group_cls in _GROUPS.values():
            add_dataclass_args(parser, group_cls, skip=("model",) if positional_model else ())

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineConfig:
        return cls(**{name: dataclass_from_args(g, args) for name, g in _GROUPS.items()})
