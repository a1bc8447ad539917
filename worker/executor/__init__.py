"""Executors: how the engine core reaches the rank(s) that run the model."""

from __future__ import annotations

from worker.config import EngineConfig
from worker.executor.base import Executor, ExecutorFailure

__all__ = ["Executor", "ExecutorFailure", "make_executor"]


def make_executor(config: EngineConfig) -> Executor:
    """In-process at tensor-parallel size 1; rank processes above it."""
    if config.parallel.tensor_parallel_size == 1 and config.parallel.nnodes == 1:
        from worker.executor.uniproc import UniProcExecutor

        return UniProcExecutor(config)
    from worker.executor.multiproc import MultiprocExecutor

    return MultiprocExecutor(config)
