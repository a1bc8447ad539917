"""The step loop's body: schedule -> run the model -> update from its output."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shared.errors import ConfigError
from shared.logging import get_logger
from worker.config import EngineConfig
from worker.kv_cache.block_pool import KVCacheEvent
from worker.models.loader import resolve_model_path
from worker.models.registry import get_model_class
from worker.models.spec import ModelSpec
from worker.outputs import RequestDelta
from worker.request import Request, RequestStatus
from worker.runner.cpu_allocator import keep_freed_memory
from worker.runner.gpu_memory import GPUMemoryProfile, MemorySnapshot, check_startup_memory
from worker.runner.kv_budget import KVBudget, plan_kv_cache
from worker.runner.model_runner import ModelRunner
from worker.runner.platform import (
    configure_cpu_threads,
    resolve_device,
    resolve_dtype,
    resolve_max_model_len,
)
from worker.scheduler.scheduler import Scheduler
from worker.stats import SchedulerStats

logger = get_logger(__name__)


@dataclass
class EngineStepOutput:
    deltas: list[RequestDelta]
    stats: SchedulerStats
    kv_events: list[KVCacheEvent]


class EngineCore:
    def __init__(
        self, config: EngineConfig, record_kv_events: bool = False, offline: bool = False
    ) -> None:
        if config.parallel.tensor_parallel_size > 1:
            raise ConfigError(
                "--tensor-parallel-size > 1 is not available yet: the layers shard, but the "
                "multi-process launcher is still to come; run with --tensor-parallel-size 1"
            )
        device = resolve_device(config.device)
        config = config.resolved(offline, device.type)
        self.config = config
        if device.type == "cpu":
            configure_cpu_threads(config.device)
            keep_freed_memory()
        self.spec = ModelSpec.from_folder(
            resolve_model_path(config.model.model, config.model.revision)
        )
        get_model_class(self.spec.architecture)  # unsupported architectures fail before any loading
        self.dtype = resolve_dtype(config.model, self.spec, device)
        self.max_model_len = resolve_max_model_len(config.model, self.spec)
        sched = config.scheduler
        if not sched.enable_chunked_prefill and sched.max_num_batched_tokens < self.max_model_len:
            raise ConfigError(
                f"--max-num-batched-tokens {sched.max_num_batched_tokens} is below --max-model-len "
                f"{self.max_model_len}; raise it or enable chunked prefill"
            )
        if device.type == "cuda":
            baseline = MemorySnapshot.take(device)
            check_startup_memory(baseline, config.cache.gpu_memory_utilization)
        self.runner = ModelRunner(config, self.spec, device, self.dtype, self.max_model_len)
        gpu_profile = None
        if device.type == "cuda":
            activation_peak = self.runner.profile_run()
            torch.cuda.empty_cache()
            after = MemorySnapshot.take(device)
            gpu_profile = GPUMemoryProfile(
                total=after.total,
                utilization=config.cache.gpu_memory_utilization,
                weights_bytes=self.runner.weights_bytes,
                activation_peak=activation_peak,
                non_torch_bytes=max(0, after.non_torch - baseline.non_torch),
            )
        self.kv_budget: KVBudget = plan_kv_cache(
            config.cache,
            self.spec,
            self.dtype,
            device,
            self.runner.weights_bytes,
            self.max_model_len,
            config.parallel.tensor_parallel_size,
            gpu_profile,
        )
        logger.info(
            "%s (%s, %s on %s): %s",
            config.model.name,
            self.spec.architecture,
            str(self.dtype).removeprefix("torch."),
            device,
            self.kv_budget.describe(),
        )
        self.runner.initialize_kv_cache(self.kv_budget.num_blocks)
        if self.runner.cuda_graphs_wanted():
            self.runner.capture_cuda_graphs()
        self.scheduler = Scheduler(
            sched, config.cache, self.kv_budget.num_blocks, record_kv_events=record_kv_events
        )

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> EngineStepOutput:
        scheduler_output = self.scheduler.schedule()
        runner_output = self.runner.execute_model(scheduler_output)
        deltas = self.scheduler.update_from_output(scheduler_output, runner_output)
        stats = self.scheduler.make_stats(scheduler_output.total_num_scheduled_tokens)
        return EngineStepOutput(deltas, stats, self.scheduler.kv.pool.take_events())
