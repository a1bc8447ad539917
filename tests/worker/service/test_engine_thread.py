"""The engine is built on the thread that steps it (worker/service/engine_loop.py):
a second thread's OpenMP team beside the stepping thread's doubled decode steps."""

from __future__ import annotations

import threading

import worker.service.server as server_module
from worker.engine.llm_engine import LLMEngine


def test_the_engine_is_built_and_stepped_on_one_thread(start_worker, monkeypatch):
    built_on: list[str] = []

    class RecordingEngine(LLMEngine):
        def __init__(self, *args, **kwargs):
            built_on.append(threading.current_thread().name)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(server_module, "LLMEngine", RecordingEngine)
    worker = start_worker()
    stepped_on = worker.on_engine(lambda engine: threading.current_thread().name)
    assert built_on == ["pagoda-engine"]
    assert stepped_on == "pagoda-engine"
