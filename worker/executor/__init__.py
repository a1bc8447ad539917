"""Executors: how the engine core reaches the rank(s) that run the model."""

from __future__ import annotations

from shared.errors import ConfigError
from worker.config import EngineConfig
from worker.executor.base import Executor, ExecutorFailure

__all__ = ["Executor", "ExecutorFailure", "make_executor"]


def make_executor(config: EngineConfig) -> Executor:
    """In-process at tensor-parallel size 1; rank processes above it."""
    if config.parallel.node_rank > 0:
        raise ConfigError(
            f"--node-rank {config.parallel.node_rank}: nodes other than 0 only run their ranks, "
            "as 'pagoda worker --node-rank R'; the engine (LLM, serve, generate) runs on node 0"
        )
    if config.parallel.tensor_parallel_size == 1 and config.parallel.nnodes == 1:
        from worker.executor.uniproc import UniProcExecutor

        return UniProcExecutor(config)
    from worker.executor.multiproc import MultiprocExecutor

    return MultiprocExecutor(config)
