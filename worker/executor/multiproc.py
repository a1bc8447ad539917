"""Tensor-parallel size > 1: one process per rank, fed by one shared-memory
broadcast per step; rank 0 answers through a second ring.

```
engine process                      rank processes (python -m worker.executor.rank_process)
  schedule ─► pickle once ─► broadcast ring ─┬─► rank 0 ─ shard ─┐ all-reduce / all-gather
                                             └─► rank 1 ─ shard ─┘ (gloo on CPU, NCCL on GPU)
            └─► step relay (TCP) ─► node 1's headless worker ─► its ring ─► ranks 2, 3 ...
  update ◄── unpickle ◄──── response ring ◄──── rank 0: sampled ids, logprobs
```

The engine process itself holds no model and never joins a collective, so
it can always notice a rank that died (it polls them while it waits, and a
monitor thread polls them between steps) and fail the step instead of hanging.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import pickle
import threading
import time

from shared import env
from shared.errors import ConfigError
from shared.logging import get_logger
from worker.config import EngineConfig
from worker.executor.base import Executor, ExecutorFailure
from worker.executor.model_plan import ModelPlan
from worker.executor.placement import device_type, local_placements, reserve_rendezvous
from worker.executor.rank_group import SHUTDOWN, LocalRankGroup
from worker.executor.step_relay import StepRelayServer, relay_port
from worker.runner.kv_budget import KVBudget
from worker.scheduler.output import ModelRunnerOutput, SchedulerOutput

logger = get_logger(__name__)

MONITOR_SECONDS = 0.5


def without_grammars(output: SchedulerOutput) -> SchedulerOutput:
    """The step with its compiled grammars left out: they do not pickle (xgrammar
    objects), so each rank compiles its own from sampling_params.structured_outputs
    (RankWorker.execute_model) and every rank masks, and samples, alike."""
    if not any(new.grammar is not None for new in output.scheduled_new_reqs):
        return output
    new_reqs = [dataclasses.replace(new, grammar=None) for new in output.scheduled_new_reqs]
    return dataclasses.replace(output, scheduled_new_reqs=new_reqs)


class MultiprocExecutor(Executor):
    def __init__(self, config: EngineConfig) -> None:
        parallel = config.parallel
        self.world_size = parallel.tensor_parallel_size
        device = device_type(config.device)
        plan = ModelPlan.make(config, device)  # config errors before any process starts
        self.spec, self.dtype, self.max_model_len = plan.spec, plan.dtype, plan.max_model_len
        self.rendezvous, self._rendezvous_port = reserve_rendezvous(parallel)
        placements = local_placements(parallel, device, self.rendezvous, config.device.cpu_cores)
        self._failure: ExecutorFailure | None = None
        self._is_closed = False
        self._relay: StepRelayServer | None = None
        self.put_seconds = self.wait_seconds = 0.0  # the engine's side of each step
        self.group = LocalRankGroup(config, placements)
        atexit.register(self.shutdown)
        try:
            if parallel.nnodes > 1:
                host, port = self.rendezvous.removeprefix("tcp://").rsplit(":", 1)
                self._relay = StepRelayServer(
                    host, relay_port(int(port)), parallel.nnodes, env.rendezvous_timeout()
                )
                self._relay.send(pickle.dumps(("config", config)))
            self.kv_budget = self._wait_ready()
        except BaseException:
            self.shutdown()
            raise
        finally:  # rank 0 listens on it now, or start-up failed
            if self._rendezvous_port is not None:
                self._rendezvous_port.close()
        self._monitor = threading.Thread(
            target=self._watch, name="pagoda-rank-monitor", daemon=True
        )
        self._monitor.start()

    @property
    def processes(self):
        return self.group.processes

    def _check_ranks(self) -> None:
        self.group.check()
        if self._relay is not None:
            node = self._relay.lost_node()
            if node is not None:
                raise ExecutorFailure(f"node {node} of the tensor-parallel group went away")

    def _wait_ready(self) -> KVBudget:
        try:
            kind, value = pickle.loads(self.group.response.get(self._check_ranks))
        except ExecutorFailure as exc:
            raise ConfigError(f"start-up failed: {exc}") from None
        if kind == "error":
            raise ConfigError(f"start-up failed on rank 0: {value}")
        return value

    def _watch(self) -> None:
        """Notice a rank that dies between steps too (an idle worker must not keep
        reporting SERVING): the failure goes to `on_failure`."""
        while not self._is_closed and self._failure is None:
            time.sleep(MONITOR_SECONDS)
            try:
                self._check_ranks()
            except ExecutorFailure as exc:
                if self._is_closed:
                    return
                self._failure = exc
                logger.error("%s", exc)
                if self.on_failure is not None:
                    self.on_failure(exc)

    def _call(self, method: str, arg: object = None) -> object:
        if self._failure is not None:
            raise self._failure
        try:
            start = time.perf_counter()
            message = pickle.dumps((method, arg), protocol=pickle.HIGHEST_PROTOCOL)
            self.group.broadcast.put(message, self._check_ranks)
            if self._relay is not None:
                self._relay.send(message)
            sent = time.perf_counter()
            kind, value = pickle.loads(self.group.response.get(self._check_ranks))
            self.put_seconds += sent - start
            self.wait_seconds += time.perf_counter() - sent
        except OSError as exc:  # the relay's connection broke
            self._failure = ExecutorFailure(f"a node of the tensor-parallel group is gone: {exc}")
            raise self._failure from None
        except ExecutorFailure as exc:
            self._failure = exc
            raise
        if kind == "error":
            # Rank 0 usually fails because a peer died under a collective: name the dead one.
            self._failure = self.group.dead_rank(wait=1.0) or ExecutorFailure(
                f"a step failed on {value[:300]}"
            )
            raise self._failure
        return value

    def execute_model(self, output: SchedulerOutput) -> ModelRunnerOutput:
        return self._call("execute_model", without_grammars(output))

    def rank_stats(self) -> dict[str, float]:
        """Rank 0's cumulative step, collective and broadcast-read seconds, and the
        checkpoint bytes it read."""
        return self._call("stats")

    def shutdown(self) -> None:
        if self._is_closed:
            return
        self._is_closed = True
        atexit.unregister(self.shutdown)
        if self._relay is not None and self._failure is None:
            with contextlib.suppress(OSError):
                self._relay.send(SHUTDOWN)
        self.group.close(ask_first=self._failure is None)
        if self._relay is not None:
            self._relay.close()
