"""`pagoda serve` and `pagoda router` as processes: start-up refusals and a clean stop."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

from tests.cluster import ENGINE_FLAGS, REPO_ROOT, start_router, wait_serving


def test_ctrl_c_stops_serve_and_its_workers_cleanly(make_checkpoint, tmp_path):
    router = start_router(
        "serve", [str(make_checkpoint("llama")), *ENGINE_FLAGS], tmp_path / "serve.log"
    )
    try:
        wait_serving(router.process, router.base_url, 1)
        pids = [
            int(p) for p in re.findall(r"started worker \d+ \(pid (\d+)\)", router.process.log())
        ]
        assert len(pids) == 1  # --num-workers defaults to 1
        router.process.process.send_signal(signal.SIGINT)
        assert router.process.process.wait(60) == 0, router.process.log()[-4000:]
    finally:
        router.process.stop()
    for pid in pids:  # reaped by serve, not orphaned
        try:
            os.kill(pid, 0)
            raise AssertionError(f"worker pid {pid} outlived pagoda serve")
        except ProcessLookupError:
            pass
    log = router.process.log()
    assert "shutting down: the router first, then the workers" in log
    assert "worker.service.cli: shutting down" in log


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    return subprocess.run(
        [sys.executable, "-m", "shared.cli", *args],
        capture_output=True, text=True, env=env, timeout=120, cwd=REPO_ROOT,
    )  # fmt: skip


def test_a_router_with_no_workers_to_find_refuses_to_start():
    result = run_cli("router", "--port", "0")
    assert result.returncode == 2
    assert "no workers to route to" in result.stderr


def test_bad_router_flags_are_refused_with_a_message():
    result = run_cli("router", "--worker", "nohostport")
    assert result.returncode == 2 and "--worker must be host:port" in result.stderr
    result = run_cli("router", "--worker", "h:1", "--affinity-threshold", "2")
    assert result.returncode == 2 and "--affinity-threshold must be in [0, 1]" in result.stderr
