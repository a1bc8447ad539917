"""Tensor-parallel size > 1: one process per rank, fed by one shared-memory
broadcast per step; rank 0 answers through a second ring.

```
engine process                      rank processes (python -m worker.executor.rank_process)
  schedule ─► pickle once ─► broadcast ring ─┬─► rank 0 ─ shard ─┐ all-reduce / all-gather
                                             └─► rank 1 ─ shard ─┘ (gloo on CPU, NCCL on GPU)
  update ◄── unpickle ◄──── response ring ◄──── rank 0: sampled ids, logprobs
```

The engine process itself holds no model and never joins a collective, so
it can always notice a rank that died (it polls them while it waits) and
fail the step instead of hanging.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from shared.errors import ConfigError
from shared.logging import get_logger
from worker.config import EngineConfig
from worker.executor.base import Executor, ExecutorFailure
from worker.executor.model_plan import ModelPlan
from worker.executor.placement import local_placements, rendezvous_address
from worker.executor.rank_process import RankLaunch
from worker.executor.shm_broadcast import (
    RingSpec,
    ShmBroadcastReader,
    ShmBroadcastWriter,
    make_doorbell,
)
from worker.runner.platform import resolve_device
from worker.scheduler.output import ModelRunnerOutput, SchedulerOutput

logger = get_logger(__name__)

# A step's pickle is ~100 bytes per scheduled request plus its new prompt tokens;
# bigger ones span several slots.
SLOT_BYTES = 1 << 20
NUM_SLOTS = 8
STOP_SECONDS = 5.0
MONITOR_SECONDS = 0.5


class MultiprocExecutor(Executor):
    def __init__(self, config: EngineConfig) -> None:
        parallel = config.parallel
        if parallel.nnodes > 1:
            raise ConfigError("--nnodes > 1 is not available yet: run all ranks on one node")
        self.world_size = parallel.tensor_parallel_size
        device = resolve_device(config.device)
        plan = ModelPlan.make(config, device)  # config errors before any process starts
        self.spec, self.dtype, self.max_model_len = plan.spec, plan.dtype, plan.max_model_len
        self.rendezvous = rendezvous_address(parallel)
        placements = local_placements(parallel, device, self.rendezvous)
        tag = uuid.uuid4().hex[:12]
        self._tmp = tempfile.TemporaryDirectory(prefix="pagoda-tp-")
        self._doorbells = [make_doorbell() for _ in placements]
        self._response_doorbell = make_doorbell()
        self._broadcast = ShmBroadcastWriter(
            RingSpec(f"pagoda-step-{tag}", len(placements), NUM_SLOTS, SLOT_BYTES),
            self._doorbells,
        )
        self._response = ShmBroadcastReader(
            RingSpec(f"pagoda-out-{tag}", 1, NUM_SLOTS, SLOT_BYTES),
            0,
            self._response_doorbell,
            create=True,
        )
        self.processes: list[subprocess.Popen] = []
        self._error_files: list[Path] = []
        self._failure: ExecutorFailure | None = None
        self._is_closed = False
        atexit.register(self.shutdown)
        try:
            for i, placement in enumerate(placements):
                self._spawn(config, placement, i)
            self.kv_budget = self._wait_ready()
        except BaseException:
            self.shutdown()
            raise
        # Timings of the engine's side of each step (bench/tp_step.py reads them).
        self.put_seconds = 0.0
        self.wait_seconds = 0.0
        self._monitor = threading.Thread(
            target=self._watch, name="pagoda-rank-monitor", daemon=True
        )
        self._monitor.start()

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

    def _spawn(self, config: EngineConfig, placement, index: int) -> None:
        error_file = Path(self._tmp.name) / f"rank{placement.rank}.err"
        self._error_files.append(error_file)
        is_first = placement.rank == 0
        launch = RankLaunch(
            config=config,
            placement=placement,
            broadcast=self._broadcast.spec,
            reader_index=index,
            doorbell=self._doorbells[index],
            response=self._response.spec if is_first else None,
            response_doorbell=self._response_doorbell if is_first else None,
            parent_pid=os.getpid(),
            error_file=str(error_file),
        )
        fds = [self._doorbells[index]] + ([self._response_doorbell] if is_first else [])
        process = subprocess.Popen(
            [sys.executable, "-m", "worker.executor.rank_process"],
            stdin=subprocess.PIPE,
            pass_fds=fds,
            start_new_session=True,  # a terminal's Ctrl-C reaches the worker, which stops us
        )
        process.stdin.write(pickle.dumps(launch, protocol=pickle.HIGHEST_PROTOCOL))
        process.stdin.close()
        self.processes.append(process)
        logger.info("started rank %d (pid %d)", placement.rank, process.pid)

    def _rank_error(self, index: int) -> str:
        with contextlib.suppress(OSError):
            text = self._error_files[index].read_text().strip()
            if text:
                return text
        return "see its log above"

    def _check_ranks(self) -> None:
        """Raise if any rank has exited (called while waiting on them)."""
        exited = [
            f"tensor-parallel rank {index} (pid {process.pid}) exited with code "
            f"{process.returncode}: {self._rank_error(index)}"
            for index, process in enumerate(self.processes)
            if process.poll() is not None
        ]
        if exited:
            # A rank killed by a signal first: the others' errors follow from it.
            exited.sort(key=lambda line: "code -" not in line)
            raise ExecutorFailure("; ".join(exited))

    def _wait_ready(self):
        try:
            kind, value = pickle.loads(self._response.get(self._check_ranks))
        except ExecutorFailure as exc:
            raise ConfigError(f"start-up failed: {exc}") from None
        if kind == "error":
            raise ConfigError(f"start-up failed on rank 0: {value}")
        return value

    def _call(self, method: str, arg: object = None) -> object:
        if self._failure is not None:
            raise self._failure
        try:
            start = time.perf_counter()
            message = pickle.dumps((method, arg), protocol=pickle.HIGHEST_PROTOCOL)
            self._broadcast.put(message, self._check_ranks)
            sent = time.perf_counter()
            kind, value = pickle.loads(self._response.get(self._check_ranks))
            self.put_seconds += sent - start
            self.wait_seconds += time.perf_counter() - sent
        except ExecutorFailure as exc:
            self._failure = exc
            raise
        if kind == "error":
            # Rank 0 usually fails because a peer died under a collective: name the dead one.
            self._failure = self._dead_rank(wait=1.0) or ExecutorFailure(
                f"a step failed on {value[:300]}"
            )
            raise self._failure
        return value

    def _dead_rank(self, wait: float) -> ExecutorFailure | None:
        deadline = time.monotonic() + wait
        while True:
            try:
                self._check_ranks()
            except ExecutorFailure as exc:
                return exc
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)

    def execute_model(self, output: SchedulerOutput) -> ModelRunnerOutput:
        return self._call("execute_model", output)

    def rank_timings(self) -> dict[str, float]:
        """Rank 0's cumulative step, collective and broadcast-read seconds."""
        return self._call("timings")

    def shutdown(self) -> None:
        if self._is_closed:
            return
        self._is_closed = True
        atexit.unregister(self.shutdown)
        if self._failure is None and all(p.poll() is None for p in self.processes):
            with contextlib.suppress(Exception):
                self._broadcast.put(pickle.dumps(("shutdown", None)), self._check_ranks)
        deadline = time.monotonic() + STOP_SECONDS
        for process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for process in self.processes:  # survivors of a failed group, stuck in a collective
            if process.poll() is None:
                process.kill()
                process.wait()
        self._broadcast.close()
        self._response.close()
        for fd in [*self._doorbells, self._response_doorbell]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._tmp.cleanup()
