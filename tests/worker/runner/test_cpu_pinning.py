"""--cpu-cores pins every thread of the process and says so; cores the process may not
use are refused. In a subprocess of its own: pinning would hold the test process too."""

from __future__ import annotations

import os
import subprocess
import sys

from shared.cpu_cores import allowed_cores
from tests.cluster import REPO_ROOT

SCRIPT = """
import logging, pathlib, re, sys, threading
logging.basicConfig(level=logging.INFO)
from shared.errors import ConfigError
from worker.config import DeviceConfig
from worker.runner.platform import configure_cpu_threads
started = threading.Event()
threading.Thread(target=started.wait, daemon=True).start()  # a thread from before
try:
    configure_cpu_threads(DeviceConfig(cpu_cores=sys.argv[1], cpu_threads=int(sys.argv[2])))
except ConfigError as exc:
    print("refused:", exc)
    sys.exit(0)
lists = {re.search(r"Cpus_allowed_list:\\s*(\\S+)", (t / "status").read_text()).group(1)
         for t in pathlib.Path("/proc/self/task").iterdir()}
print("threads on", sorted(lists))
"""


def run(cores: str, threads: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, cores, str(threads)],
        capture_output=True, text=True, env=env, timeout=120, cwd=REPO_ROOT,
    )  # fmt: skip


def test_every_thread_goes_to_the_cores_and_the_log_says_which():
    core = str(allowed_cores()[-1])
    result = run(core, 2)
    assert result.stdout.strip() == f"threads on ['{core}']", result.stderr
    assert f"CPU: 2 compute threads on cores {core}" in result.stderr
    assert "2 compute threads on 1 cores take turns" in result.stderr


def test_cores_outside_the_allowed_set_are_refused():
    outside = max(allowed_cores()) + 1
    result = run(str(outside), 1)
    assert f"refused: --cpu-cores {outside} names cores this process may not use" in result.stdout
