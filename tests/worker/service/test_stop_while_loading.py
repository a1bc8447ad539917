"""A worker that gets SIGTERM while it still loads its model stops at once."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

from shared.ports import free_port_run
from tests.cluster import ENGINE_FLAGS, REPO_ROOT, PagodaProcess
from tests.conftest import wait_for


def test_sigterm_while_loading_stops_the_worker_promptly(make_checkpoint, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(make_checkpoint("llama"), folder)
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")  # nobody writes it: loading blocks for good
    args = ["--model", str(folder), "--host=127.0.0.1", f"--port={free_port_run()}", *ENGINE_FLAGS]
    worker = PagodaProcess("worker", args, tmp_path / "worker.log")
    try:
        wait_for(lambda: "; loading " in worker.log(), timeout=120, interval=0.1, what="loading")
        worker.check_alive()
        sent = time.monotonic()
        worker.process.send_signal(signal.SIGTERM)
        assert worker.process.wait(10) == 0, worker.log()
        assert time.monotonic() - sent < 5
    finally:
        worker.stop()
    log = worker.log()
    assert "stopped while loading the model" in log
    assert "serving" not in log


def test_stopping_while_loading_ends_the_build_processes_it_started():
    """A kernel build's compiler is a child of the worker: it must not run on, orphaned."""
    script = (
        "import subprocess; from worker.service.cli import _stop_children; "
        "build = subprocess.Popen(['sleep', '60']); _stop_children(); print(build.wait(10))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert result.stdout.strip() == str(-signal.SIGTERM), result.stderr
