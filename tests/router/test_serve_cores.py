"""`pagoda serve --num-workers 2` on CPU: each worker's threads on cores of its own
(read from /proc), and no worker outlives a `kill -9` of `pagoda serve`, loaded or
still loading."""

from __future__ import annotations

import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from shared.cpu_cores import allowed_cores, parse_core_list
from tests.cluster import ENGINE_FLAGS, start_router, wait_serving
from tests.conftest import wait_for

# A few seconds: the worker's parent watch polls twice a second.
ORPHAN_TIMEOUT_S = 5.0


def worker_pids(log: str) -> dict[int, str]:
    """pid -> cores, from serve's "started worker" lines."""
    found = re.findall(r"started worker \d+ \(pid (\d+)\) on port \d+, cores (\S+)", log)
    return {int(pid): cores for pid, cores in found}


def thread_cores(pid: int) -> set[str]:
    """The Cpus_allowed_list of every thread of process `pid`."""
    lists = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = (task / "status").read_text()
        lists.add(re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.M).group(1))
    return lists


def is_gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return re.search(r"^State:\s*Z", status, re.M) is not None  # a zombie has stopped


def kill_serve_and_wait_for_orphans(router, pids) -> None:
    router.process.process.send_signal(signal.SIGKILL)
    router.process.process.wait(10)
    wait_for(
        lambda: all(is_gone(pid) for pid in pids),
        timeout=ORPHAN_TIMEOUT_S,
        interval=0.1,
        what="every worker to stop after kill -9 of pagoda serve",
    )


@pytest.mark.skipif(len(allowed_cores()) < 2, reason="needs two cores")
def test_two_workers_run_on_disjoint_cores_and_die_with_serve(make_checkpoint, tmp_path):
    args = [str(make_checkpoint("llama")), "--num-workers=2", *ENGINE_FLAGS]
    router = start_router("serve", args, tmp_path / "serve.log")
    pids: dict[int, str] = {}
    try:
        wait_serving(router.process, router.base_url, 2)
        log = router.process.log()
        pids = worker_pids(log)
        assert len(pids) == 2, log
        sets = []
        for pid, cores in pids.items():
            assert thread_cores(pid) == {cores}, f"worker {pid}: threads on {thread_cores(pid)}"
            sets.append(set(parse_core_list(cores)))
            assert f"CPU: 1 compute threads on cores {cores}" in log
        assert not sets[0] & sets[1]
        assert sets[0] | sets[1] <= set(allowed_cores())
        kill_serve_and_wait_for_orphans(router, pids)
    finally:
        stop_leaving_no_worker(router, pids)


@pytest.fixture
def never_loading_checkpoint(make_checkpoint, tmp_path) -> Path:
    """A checkpoint whose config.json is a FIFO nobody writes: loading blocks forever,
    as a long kernel build or a slow disk would hold a worker in its loading stage."""
    folder = tmp_path / "model"
    shutil.copytree(make_checkpoint("llama"), folder)
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")
    return folder


def test_workers_still_loading_die_with_serve(never_loading_checkpoint, tmp_path):
    args = [str(never_loading_checkpoint), "--num-workers=2", *ENGINE_FLAGS]
    router = start_router("serve", args, tmp_path / "serve.log")
    pids: dict[int, str] = {}
    try:
        wait_for(
            lambda: router.process.log().count("; loading ") == 2,
            timeout=120,
            interval=0.1,
            what="two workers loading",
        )
        pids = worker_pids(router.process.log())
        assert len(pids) == 2
        assert "serving at" not in router.process.log()  # nothing can be served yet
        kill_serve_and_wait_for_orphans(router, pids)
    finally:
        stop_leaving_no_worker(router, pids)


def stop_leaving_no_worker(router, pids) -> None:
    """Cleanup whatever the test's assertions left: serve, then any worker alive."""
    router.process.stop()
    for pid in pids:
        if not is_gone(pid):
            os.kill(pid, signal.SIGKILL)
