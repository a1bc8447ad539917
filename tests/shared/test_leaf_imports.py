"""Leaf types import nothing above them, and the router never pulls in the engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _modules_after(statement: str) -> set[str]:
    code = f"{statement}\nimport sys\nprint(' '.join(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    return set(result.stdout.split())


def test_leaf_types_import_no_engine_and_no_torch():
    modules = _modules_after(
        "import shared.sampling_params, worker.request, worker.outputs, worker.stats"
    )
    assert "torch" not in modules
    assert not {m for m in modules if m.startswith(("worker.engine", "worker.scheduler", "router"))}


def test_router_does_not_import_the_engine():
    modules = _modules_after("import router.server, router.openai.app, router.grpc_front")
    assert "torch" not in modules
    assert not {m for m in modules if m.startswith("worker")}
