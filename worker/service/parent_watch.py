"""A worker started by `pagoda serve` stops when that process is gone.

PR_SET_PDEATHSIG (set before exec) delivers SIGTERM when the parent dies,
but it follows the parent *thread* that forked the child, and it is lost if
the parent died between fork and prctl. So the worker also watches: a
daemon thread polls its parent's id and, once `pagoda serve` is gone (the
child was re-parented), sends itself SIGTERM, which stops it as a signal
would at every stage; if that has not ended the process `grace_s` later, it
exits hard. Started first thing, before the model loads.
"""

from __future__ import annotations

import os
import signal
import threading

from shared.logging import get_logger

logger = get_logger(__name__)

POLL_S = 0.5


def watch_parent(parent_pid: int, grace_s: float = 10.0) -> threading.Thread:
    def run() -> None:
        stop = threading.Event()
        while os.getppid() == parent_pid:
            stop.wait(POLL_S)
        logger.warning("the parent process %d is gone: stopping", parent_pid)
        os.kill(os.getpid(), signal.SIGTERM)
        stop.wait(grace_s)
        logger.error("still running %gs after the parent went: exiting now", grace_s)
        os._exit(1)

    thread = threading.Thread(target=run, name="pagoda-parent-watch", daemon=True)
    thread.start()
    return thread
