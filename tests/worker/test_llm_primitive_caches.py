"""The offline LLM (and so `pagoda generate`) bounds oneDNN's kernel caches before
its engine runs a linear, as `pagoda worker` does; a capacity already in the
environment wins."""

from __future__ import annotations

import os

import pytest

import worker.llm as llm_module
from worker.service.primitive_caches import CAPACITY_VARIABLES, DEFAULT_CAPACITY


class _RecordingEngine:
    """Stands in for LLMEngine: notes the caps the environment holds when it is built."""

    def __init__(self, config, offline: bool) -> None:
        self.caps = {name: os.environ.get(name) for name in CAPACITY_VARIABLES}


@pytest.fixture
def recording_engine(monkeypatch):
    for name in CAPACITY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(llm_module, "LLMEngine", _RecordingEngine)


def test_the_caps_are_set_before_the_engine_is_built(recording_engine):
    llm = llm_module.LLM(config=object())
    assert llm.engine.caps == dict.fromkeys(CAPACITY_VARIABLES, str(DEFAULT_CAPACITY))


def test_a_cap_in_the_environment_wins(recording_engine, monkeypatch):
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "7")
    llm = llm_module.LLM(config=object())
    assert llm.engine.caps == {
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "7",
        "LRU_CACHE_CAPACITY": str(DEFAULT_CAPACITY),
    }
