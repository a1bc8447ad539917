"""The router and the worker pick gRPC's legacy TCP transport before grpc loads
(shared/grpc_transport.py), and leave a user's GRPC_EXPERIMENTS alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from shared.grpc_transport import LEGACY_TCP

_PRINT = "import {module}, os; print(os.environ.get('GRPC_EXPERIMENTS'))"


def _imported(module: str, experiments: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    if experiments is not None:
        env["GRPC_EXPERIMENTS"] = experiments
    done = subprocess.run(
        [sys.executable, "-c", _PRINT.format(module=module)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.mark.parametrize("module", ["router.serve", "router.cli", "worker.service.cli"])
def test_entry_points_choose_the_legacy_transport_before_grpc_loads(module):
    assert _imported(module, None) == LEGACY_TCP


def test_a_users_choice_is_kept():
    assert _imported("router.serve", "-event_engine_client") == "-event_engine_client"


def test_too_late_once_grpc_is_loaded():
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    code = (
        "import grpc, os; from shared.grpc_transport import prefer_legacy_tcp; "
        "prefer_legacy_tcp(); print(os.environ.get('GRPC_EXPERIMENTS'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "None"
