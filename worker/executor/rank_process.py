"""`python -m worker.executor.rank_process`: one tensor-parallel rank.

The executor starts one per rank and writes its `RankLaunch` (pickled) to the
process's stdin. The rank builds its RankWorker, then serves the executor's
broadcast: every rank runs each step; rank 0 alone answers.

A rank never outlives the process that started it: PR_SET_PDEATHSIG kills it
with its parent, and a watchdog thread (for what the signal misses: a parent
thread that exits while the parent lives on) and the idle wait both check the
parent is still there.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from shared.logging import configure_logging, get_logger
from worker import distributed
from worker.config import EngineConfig
from worker.executor.rank_worker import RankPlacement, RankWorker
from worker.executor.shm_broadcast import RingSpec, ShmBroadcastReader, ShmBroadcastWriter
from worker.models import checkpoint_slice

logger = get_logger(__name__)

_PR_SET_PDEATHSIG = 1
WATCHDOG_SECONDS = 1.0


@dataclass(frozen=True)
class RankLaunch:
    config: EngineConfig
    placement: RankPlacement
    broadcast: RingSpec
    reader_index: int
    doorbell: int  # this rank's eventfd, inherited
    response: RingSpec | None  # rank 0: where it answers
    response_doorbell: int | None
    parent_pid: int
    error_file: str  # why this rank exited, for the executor's message


class ParentGone(Exception):
    pass


def _die_with_parent(parent_pid: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # it died before the signal was armed
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(WATCHDOG_SECONDS)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="pagoda-rank-watchdog", daemon=True).start()


def serve(launch: RankLaunch) -> None:
    rank = launch.placement.rank
    reader = ShmBroadcastReader(launch.broadcast, launch.reader_index, launch.doorbell)
    answer = None
    if launch.response is not None:
        answer = ShmBroadcastWriter(launch.response, [launch.response_doorbell], create=False)

    def reply(kind: str, value: object) -> None:
        if answer is not None:
            answer.put(pickle.dumps((kind, value), protocol=pickle.HIGHEST_PROTOCOL))

    def parent_alive() -> None:
        if os.getppid() != launch.parent_pid:
            raise ParentGone

    try:
        worker = RankWorker(launch.config, launch.placement)
    except Exception as exc:
        Path(launch.error_file).write_text(f"{type(exc).__name__}: {exc}")
        reply("error", f"{type(exc).__name__}: {exc}")
        raise
    reply("ready", worker.kv_budget)
    step_seconds = unpickle_seconds = 0.0
    while True:
        message = reader.get(parent_alive)
        start = time.perf_counter()
        method, arg = pickle.loads(message)
        unpickle_seconds += time.perf_counter() - start
        if method == "shutdown":
            return
        if method == "stats":
            reply(
                "ok",
                {
                    "step_seconds": step_seconds,
                    "collective_seconds": distributed.collective_seconds,
                    "collective_calls": distributed.collective_calls,
                    "broadcast_read_seconds": reader.read_seconds + unpickle_seconds,
                    "checkpoint_bytes_read": checkpoint_slice.bytes_read,
                },
            )
            continue
        try:
            result = worker.execute_model(arg)
        except Exception as exc:
            Path(launch.error_file).write_text(f"rank {rank}: {type(exc).__name__}: {exc}")
            reply("error", f"rank {rank}: {type(exc).__name__}: {exc}")
            raise
        step_seconds += time.perf_counter() - start
        reply("ok", result)


def main() -> int:
    launch: RankLaunch = pickle.load(sys.stdin.buffer)
    configure_logging()
    _die_with_parent(launch.parent_pid)
    try:
        serve(launch)
    except ParentGone:
        return 1
    except Exception:
        logger.error("rank %d failed:\n%s", launch.placement.rank, traceback.format_exc())
        return 2
    finally:
        distributed.destroy_tensor_parallel()
    return 0


if __name__ == "__main__":
    sys.exit(main())
