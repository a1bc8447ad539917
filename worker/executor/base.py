"""The engine core's one view of the ranks that run the model.

```
EngineCore.step(): scheduler.schedule() ─► executor.execute_model(SchedulerOutput)
                                              │ UniProcExecutor: RankWorker in this process
                                              │ MultiprocExecutor: one broadcast to N rank
                                              ▼   processes; rank 0 answers
                   scheduler.update_from_output(ModelRunnerOutput)
```
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from shared.errors import UnavailableError
from worker.models.spec import ModelSpec
from worker.runner.kv_budget import KVBudget
from worker.scheduler.output import ModelRunnerOutput, SchedulerOutput


class ExecutorFailure(UnavailableError):
    """A rank died or stopped answering: the group cannot step any more. The
    worker fails its streams UNAVAILABLE and stops (the router fails over)."""


class Executor(ABC):
    spec: ModelSpec
    dtype: torch.dtype
    max_model_len: int
    # One rank's cache; every rank holds the same number of blocks.
    kv_budget: KVBudget
    world_size: int
    # Called (from another thread) when the ranks fail between steps.
    on_failure: Callable[[ExecutorFailure], None] | None = None

    @abstractmethod
    def execute_model(self, output: SchedulerOutput) -> ModelRunnerOutput: ...

    def shutdown(self) -> None:  # noqa: B027 (nothing to release in-process)
        """Release the ranks; safe to call twice."""
