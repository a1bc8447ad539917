"""The step loop's body: schedule -> run the model -> update from its output."""

from __future__ import annotations

from dataclasses import dataclass

from worker.config import EngineConfig
from worker.executor import Executor, make_executor
from worker.executor.placement import device_type
from worker.kv_cache.block_pool import KVCacheEvent
from worker.outputs import RequestDelta
from worker.request import Request, RequestStatus
from worker.runner.kv_budget import KVBudget
from worker.runner.model_runner import ModelRunner
from worker.scheduler.scheduler import Scheduler
from worker.stats import SchedulerStats


@dataclass
class EngineStepOutput:
    deltas: list[RequestDelta]
    stats: SchedulerStats
    kv_events: list[KVCacheEvent]


class EngineCore:
    """Owns the scheduler; the executor owns the ranks (device, threads, weights, KV)."""

    def __init__(
        self, config: EngineConfig, record_kv_events: bool = False, offline: bool = False
    ) -> None:
        config = config.resolved(offline, device_type(config.device).type)
        self.config = config
        self.executor: Executor = make_executor(config)
        self.spec = self.executor.spec
        self.dtype = self.executor.dtype
        self.max_model_len = self.executor.max_model_len
        self.kv_budget: KVBudget = self.executor.kv_budget
        self.scheduler = Scheduler(
            config.scheduler,
            config.cache,
            self.kv_budget.num_blocks,
            record_kv_events=record_kv_events,
        )

    @property
    def runner(self) -> ModelRunner:
        """The in-process model runner (tensor-parallel size 1 only)."""
        runner = getattr(self.executor, "runner", None)
        if runner is None:
            raise AttributeError("the model runners live in the rank processes at TP > 1")
        return runner

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> EngineStepOutput:
        scheduler_output = self.scheduler.schedule()
        runner_output = self.executor.execute_model(scheduler_output)
        deltas = self.scheduler.update_from_output(scheduler_output, runner_output)
        stats = self.scheduler.make_stats(scheduler_output.total_num_scheduled_tokens)
        return EngineStepOutput(deltas, stats, self.scheduler.kv.pool.take_events())

    def shutdown(self) -> None:
        self.executor.shutdown()
