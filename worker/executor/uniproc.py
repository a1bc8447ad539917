"""Tensor-parallel size 1: the one rank runs in the engine's own process and
thread, so a step costs exactly what the model runner costs."""

from __future__ import annotations

from worker.config import EngineConfig
from worker.executor.base import Executor
from worker.executor.rank_worker import RankWorker
from worker.runner.model_runner import ModelRunner
from worker.scheduler.output import ModelRunnerOutput, SchedulerOutput


class UniProcExecutor(Executor):
    world_size = 1

    def __init__(self, config: EngineConfig) -> None:
        self.worker = RankWorker(config)
        plan = self.worker.plan
        self.spec, self.dtype, self.max_model_len = plan.spec, plan.dtype, plan.max_model_len
        self.kv_budget = self.worker.kv_budget

    @property
    def runner(self) -> ModelRunner:
        return self.worker.runner

    def execute_model(self, output: SchedulerOutput) -> ModelRunnerOutput:
        return self.worker.execute_model(output)
