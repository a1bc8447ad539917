"""`pagoda serve` with two TP=2 workers: killing a rank of one takes that worker
down and the other keeps answering."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.cluster import ENGINE_FLAGS
from tests.conftest import wait_for
from tests.router.conftest import API_KEY, MODEL, serving


def _children(pid: int, command: bytes) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            is_child = int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid
            if is_child and command in (stat.parent / "cmdline").read_bytes():
                kids.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return sorted(kids)


@pytest.mark.slow
def test_a_dead_rank_takes_one_worker_down_and_the_other_serves(make_checkpoint, tmp_path):
    args = [str(make_checkpoint("llama")), "--num-workers=2", "-tp", "2"]
    args += [f"--served-model-name={MODEL}", f"--api-key={API_KEY}", *ENGINE_FLAGS]
    with serving(args, tmp_path / "serve.log", 2) as served:
        client = served.client()
        want = client.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=8, temperature=0)
        workers = _children(served.router.process.process.pid, b"worker")
        assert len(workers) == 2
        ranks = _children(workers[0], b"worker.executor.rank_process")
        assert len(ranks) == 2
        os.kill(ranks[1], signal.SIGKILL)
        wait_for(lambda: not Path(f"/proc/{workers[0]}").exists() or
                 Path(f"/proc/{workers[0]}/stat").read_text().split()[2] == "Z",
                 timeout=60, what="the worker with the dead rank to exit")  # fmt: skip
        for _ in range(4):
            got = client.completions.create(
                model=MODEL, prompt=[5, 6, 7], max_tokens=8, temperature=0
            )
            assert got.choices[0].text == want.choices[0].text
        assert "tensor-parallel rank 1" in served.router.process.log()
