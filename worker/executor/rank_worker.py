"""One rank's share of the engine: its device, threads, model shard and KV cache.

The same class runs in the engine's own process at tensor-parallel size 1
(UniProcExecutor) and in each rank process above it (MultiprocExecutor), so
start-up and stepping are one code path at every world size.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from shared.cpu_cores import format_core_list
from shared.logging import get_logger
from worker.config import EngineConfig
from worker.distributed import init_tensor_parallel, tp_min
from worker.executor.model_plan import ModelPlan
from worker.runner.cpu_allocator import keep_freed_memory
from worker.runner.gpu_memory import GPUMemoryProfile, MemorySnapshot, check_startup_memory
from worker.runner.kv_budget import KVBudget, plan_kv_cache
from worker.runner.model_runner import ModelRunner
from worker.runner.platform import configure_cpu_threads, resolve_device
from worker.scheduler.output import ModelRunnerOutput, SchedulerOutput

logger = get_logger(__name__)


@dataclass(frozen=True)
class RankPlacement:
    """Where one rank runs: its place in the group and the hardware it owns."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0  # index among this machine's ranks: the GPU it drives
    num_local_ranks: int = 1
    cpu_cores: tuple[int, ...] | None = None  # CPU ranks: the cores this one owns
    init_method: str | None = None  # torch.distributed rendezvous, when world_size > 1


class RankWorker:
    def __init__(self, config: EngineConfig, placement: RankPlacement = RankPlacement()) -> None:
        self.config = config
        self.placement = placement
        if config.device.device != "cpu" and placement.world_size > 1 and torch.cuda.is_available():
            torch.cuda.set_device(placement.local_rank)
        device = self.device = resolve_device(config.device)
        if device.type == "cpu":
            device_config = config.device
            if placement.cpu_cores is not None:
                # The rank's share of the worker's cores replaces --cpu-cores, which
                # names them all.
                device_config = dataclasses.replace(
                    device_config, cpu_cores=format_core_list(placement.cpu_cores)
                )
            configure_cpu_threads(device_config)
            keep_freed_memory()
        self.plan = ModelPlan.make(config, device)
        self._grammars = None  # a rank process's own GrammarCompiler, made on first use
        if placement.world_size > 1:
            backend = "nccl" if device.type == "cuda" else "gloo"
            init_tensor_parallel(
                placement.rank, placement.world_size, placement.init_method, backend, device
            )
        if device.type == "cuda":
            baseline = MemorySnapshot.take(device)
            check_startup_memory(baseline, config.cache.gpu_memory_utilization)
        spec, dtype = self.plan.spec, self.plan.dtype
        self.runner = ModelRunner(config, spec, device, dtype, self.plan.max_model_len)
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
        budget = plan_kv_cache(
            config.cache,
            spec,
            dtype,
            device,
            self.runner.weights_bytes,
            self.plan.max_model_len,
            placement.world_size,
            gpu_profile,
            num_local_ranks=placement.num_local_ranks,
        )
        # NOTE: one scheduler hands out block ids for the whole group, so every
        # rank's cache has the same number of blocks: the smallest any rank fits.
        self.kv_budget: KVBudget = dataclasses.replace(budget, num_blocks=tp_min(budget.num_blocks))
        if placement.rank == 0:
            logger.info(
                "%s (%s, %s on %s%s): %s",
                config.model.name,
                spec.architecture,
                str(dtype).removeprefix("torch."),
                device,
                f" x {placement.world_size} ranks" if placement.world_size > 1 else "",
                self.kv_budget.describe(),
            )
        self.runner.initialize_kv_cache(self.kv_budget.num_blocks)
        if self.runner.cuda_graphs_wanted():
            self.runner.capture_cuda_graphs()

    def execute_model(self, output: SchedulerOutput) -> ModelRunnerOutput:
        return self.runner.execute_model(self._with_grammars(output))

    def _with_grammars(self, output: SchedulerOutput) -> SchedulerOutput:
        """In a rank process, the grammars the engine process compiled (and could
        not send, see multiproc.without_grammars), compiled again here: cached per
        constraint, so once per schema and rank."""
        missing = [
            new
            for new in output.scheduled_new_reqs
            if new.grammar is None and new.sampling_params.structured_outputs is not None
        ]
        if not missing:
            return output
        if self._grammars is None:
            from worker.structured.compiler import GrammarCompiler

            spec = self.plan.spec
            tokenizer = self.config.model.tokenizer or spec.path
            self._grammars = GrammarCompiler(tokenizer, spec.vocab_size, spec.eos_token_ids)
        new_reqs = [
            dataclasses.replace(
                new, grammar=self._grammars.compile(new.sampling_params.structured_outputs)
            )
            if new in missing
            else new
            for new in output.scheduled_new_reqs
        ]
        return dataclasses.replace(output, scheduled_new_reqs=new_reqs)
