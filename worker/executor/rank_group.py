"""This machine's rank processes: spawned, fed through one shared-memory ring,
watched, and stopped.

Node 0's MultiprocExecutor owns one (with the ring rank 0 answers on); each
other node's headless worker owns one fed from node 0's step relay.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from shared.logging import get_logger
from worker.config import EngineConfig
from worker.executor.base import ExecutorFailure
from worker.executor.rank_process import RankLaunch
from worker.executor.rank_worker import RankPlacement
from worker.executor.shm_broadcast import (
    RingSpec,
    ShmBroadcastReader,
    ShmBroadcastWriter,
    make_doorbell,
)

logger = get_logger(__name__)

# A step's pickle is ~100 bytes per scheduled request plus its new prompt tokens;
# bigger ones span several slots.
SLOT_BYTES = 1 << 20
NUM_SLOTS = 8
STOP_SECONDS = 5.0
SHUTDOWN = pickle.dumps(("shutdown", None), protocol=pickle.HIGHEST_PROTOCOL)


class LocalRankGroup:
    def __init__(self, config: EngineConfig, placements: list[RankPlacement]) -> None:
        tag = uuid.uuid4().hex[:12]
        self._tmp = tempfile.TemporaryDirectory(prefix="pagoda-tp-")
        self._doorbells = [make_doorbell() for _ in placements]
        self.broadcast = ShmBroadcastWriter(
            RingSpec(f"pagoda-step-{tag}", len(placements), NUM_SLOTS, SLOT_BYTES),
            self._doorbells,
        )
        has_rank0 = placements[0].rank == 0
        self._response_doorbell = make_doorbell() if has_rank0 else None
        # Rank 0's answers, when rank 0 is on this machine.
        self.response = (
            ShmBroadcastReader(
                RingSpec(f"pagoda-out-{tag}", 1, NUM_SLOTS, SLOT_BYTES),
                0,
                self._response_doorbell,
                create=True,
            )
            if has_rank0
            else None
        )
        self.ranks = [p.rank for p in placements]
        self.processes: list[subprocess.Popen] = []
        self._error_files: list[Path] = []
        self._is_closed = False
        try:
            for index, placement in enumerate(placements):
                self._spawn(config, placement, index)
        except BaseException:
            self.close()
            raise

    def _spawn(self, config: EngineConfig, placement: RankPlacement, index: int) -> None:
        error_file = Path(self._tmp.name) / f"rank{placement.rank}.err"
        self._error_files.append(error_file)
        answers = placement.rank == 0
        launch = RankLaunch(
            config=config,
            placement=placement,
            broadcast=self.broadcast.spec,
            reader_index=index,
            doorbell=self._doorbells[index],
            response=self.response.spec if answers else None,
            response_doorbell=self._response_doorbell if answers else None,
            parent_pid=os.getpid(),
            error_file=str(error_file),
        )
        fds = [self._doorbells[index]] + ([self._response_doorbell] if answers else [])
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

    def check(self) -> None:
        """Raise if any rank has exited (called while waiting on them)."""
        exited = [
            f"tensor-parallel rank {self.ranks[index]} (pid {process.pid}) exited with code "
            f"{process.returncode}: {self._rank_error(index)}"
            for index, process in enumerate(self.processes)
            if process.poll() is not None
        ]
        if exited:
            # A rank killed by a signal first: the others' errors follow from it.
            exited.sort(key=lambda line: "code -" not in line)
            raise ExecutorFailure("; ".join(exited))

    def dead_rank(self, wait: float) -> ExecutorFailure | None:
        """The failure of a rank that exits within `wait` seconds, if one does."""
        deadline = time.monotonic() + wait
        while True:
            try:
                self.check()
            except ExecutorFailure as exc:
                return exc
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)

    def all_alive(self) -> bool:
        return all(p.poll() is None for p in self.processes)

    def close(self, ask_first: bool = True) -> None:
        """Ask the ranks to stop (ask_first), then kill what is left; safe to call twice."""
        if self._is_closed:
            return
        self._is_closed = True
        if ask_first and self.processes and self.all_alive():
            with contextlib.suppress(Exception):
                self.broadcast.put(SHUTDOWN, self.check)
        deadline = time.monotonic() + STOP_SECONDS
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
        for process in self.processes:  # survivors of a failed group, stuck in a collective
            if process.poll() is None:
                process.kill()
                process.wait()
        self.broadcast.close()
        if self.response is not None:
            self.response.close()
        for fd in [*self._doorbells, self._response_doorbell]:
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._tmp.cleanup()
