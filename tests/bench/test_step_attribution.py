"""Exclusive-time attribution and the profile table, on a hand-driven clock."""

from __future__ import annotations

import pytest

from bench.profile_table import profile_table, profile_tables
from bench.step_attribution import (
    BETWEEN_STEPS,
    Attribution,
    StepLog,
    step_kind,
    summarize_steps,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0  # in ticks: whole numbers keep the sums exact

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _engine(clock: Clock, attribution: Attribution):
    """A step of 10 ticks: 1 its own, a layer of 9 holding a linear of 5."""

    def linear():
        clock.advance(5)

    def layer():
        clock.advance(2)
        timed_linear()
        clock.advance(2)

    def step():
        clock.advance(1)
        timed_layer()
        return "out"

    timed_linear = attribution.wrap(linear, "linear")
    timed_layer = attribution.wrap(layer, "glue")
    return attribution.wrap(step, "engine")


def test_nested_calls_count_only_their_own_time():
    clock = Clock()
    attribution = Attribution(clock)
    step = _engine(clock, attribution)
    assert step() == "out"
    assert dict(attribution.totals) == {"linear": 5, "glue": 4, "engine": 1}
    assert dict(attribution.calls) == {"linear": 1, "glue": 1, "engine": 1}


def test_a_raising_call_still_counts_and_unwinds():
    clock = Clock()
    attribution = Attribution(clock)

    def boom():
        clock.advance(3)
        raise ValueError("x")

    timed = attribution.wrap(boom, "boom")
    outer = attribution.wrap(lambda: clock.advance(1) or timed(), "outer")
    with pytest.raises(ValueError):
        outer()
    assert dict(attribution.totals) == {"boom": 3, "outer": 1}
    assert attribution._stack == []


def test_step_log_cuts_steps_and_keeps_the_gap_between_them():
    clock = Clock()
    attribution = Attribution(clock)
    step = _engine(clock, attribution)
    log = StepLog(attribution)
    for kind in ("mixed", "decode"):
        log.begin("empty")
        log.set_kind(kind)
        step()
        log.end()
        clock.advance(0.5)  # the caller's loop
    assert [k for k, _ in log.steps] == ["mixed", "decode"]
    assert log.steps[0][1] == {"linear": 5, "glue": 4, "engine": 1, BETWEEN_STEPS: 0.5}
    assert BETWEEN_STEPS not in log.steps[1][1]  # no next step: no gap known


def test_step_kind():
    assert step_kind([1, 1, 1]) == "decode"
    assert step_kind([512, 300]) == "prefill"
    assert step_kind([1, 1, 512]) == "mixed"
    assert step_kind([]) == "empty"


STEPS = [
    ("mixed", {"linear": 0.006, "glue": 0.002}),
    ("mixed", {"linear": 0.004, "glue": 0.002, "extra": 0.002}),
    ("decode", {"linear": 0.003, "glue": 0.001}),
]


def test_summarize_steps_means_per_kind_in_category_order():
    summary = summarize_steps(STEPS, ["glue", "linear", "unused"])
    assert list(summary) == ["all", "mixed", "decode"]
    assert summary["mixed"]["count"] == 2
    assert list(summary["all"]["ms_per_step"]) == ["glue", "linear", "unused", "extra"]
    rounded = {k: {c: round(v, 9) for c, v in s["ms_per_step"].items()} for k, s in summary.items()}
    assert rounded["mixed"] == {"glue": 2.0, "linear": 5.0, "unused": 0.0, "extra": 1.0}
    assert rounded["all"] == {"glue": round(5 / 3, 9), "linear": round(13 / 3, 9), "unused": 0.0,
                              "extra": round(2 / 3, 9)}  # fmt: skip


EXPECTED_TABLE = """\
### where a step's time goes: mixed (bfloat16, one thread, its CPU time, load average 9.5)

| category | all (4 steps) ms | % | mixed (3 steps) ms | % | decode (1 steps) ms | % |
|---|---:|---:|---:|---:|---:|---:|
| linear: qkv_proj | 3.00 | 30.0% | 3.50 | 35.0% | 1.50 | 30.0% |
| attention | 7.00 | 70.0% | 6.50 | 65.0% | 3.50 | 70.0% |
| **step** | **10.00** | 100% | **10.00** | 100% | **5.00** | 100% |

Timers: 346 timed calls per step, about 0.24 ms per step of their own overhead, inside the rows above.
"""

RECORD = {
    "kind": "step_profile",
    "workload": "mixed",
    "dtype": "bfloat16",
    "clock": "thread",
    "steps": {
        "all": {"count": 4, "ms_per_step": {"linear: qkv_proj": 3.0, "attention": 7.0}},
        "decode": {"count": 1, "ms_per_step": {"linear: qkv_proj": 1.5, "attention": 3.5}},
        "mixed": {"count": 3, "ms_per_step": {"linear: qkv_proj": 3.5, "attention": 6.5}},
    },
    "timed_calls_per_step": 346.0,
    "timer_overhead_ms_per_step": 0.24,
    "machine": {"load_avg_1m": 9.5},
}


def test_profile_table_exact():
    assert "\n".join(profile_table(RECORD)) + "\n" == EXPECTED_TABLE + "\n"
    # the summary keeps the last line per workload and clock
    older = {**RECORD, "dtype": "float32"}
    wall = {**RECORD, "clock": "wall", "cpu_threads": 2}
    tables = profile_tables([older, RECORD, {"kind": "serve"}, wall])
    assert tables == profile_table(RECORD) + profile_table(wall)
    assert "(bfloat16, wall time, 2 threads, load average 9.5)" in profile_table(wall)[0]


def test_profile_table_says_when_the_native_loop_was_off():
    off = {**RECORD, "wrapped": ["engine.step", "decode plan's Python loop (the native loop off)"]}
    extra = profile_table(off)[len(profile_table(RECORD)) - 1 :]
    assert extra == [
        "",
        "Decode steps ran on the decode plan's Python loop so that each kernel could be timed; "
        "the engine runs them from one C++ call (worker/models/decode_stack.py), without most "
        'of "forward glue" and the calls\' own overhead.',
        "",
    ]
