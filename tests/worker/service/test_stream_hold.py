"""StreamHold: which steps' deltas go out, and when (worker/service/stream_hold.py)."""

from __future__ import annotations

import pytest

from worker.outputs import RequestDelta
from worker.service.stream_hold import StreamHold


def step(token: int, index: int = 0, finish: str | None = None) -> list[RequestDelta]:
    return [RequestDelta("r", [token], index=index, finish_reason=finish)]


def run(hold: StreamHold, steps: list[list[RequestDelta]]) -> list[list[int] | None]:
    """Per step, the tokens handed out (sample 0's), or None while held."""
    sent = []
    for deltas in steps:
        out = hold.offer("r", deltas)
        sent.append(None if out is None else [t for d in out for t in d.new_token_ids])
    return sent


def test_first_token_at_once_then_every_interval_and_the_last_at_once():
    hold = StreamHold(4)
    hold.open("r", None)
    steps = [step(t) for t in range(1, 10)] + [step(10, finish="length")]
    assert run(hold, steps) == [
        [1],
        None, None, None, [2, 3, 4, 5],
        None, None, None, [6, 7, 8, 9],
        [10],
    ]  # fmt: skip


def test_interval_one_passes_every_step_through_untouched():
    hold = StreamHold(1)
    hold.open("r", None)
    deltas = step(7)
    assert hold.offer("r", deltas) is deltas
    assert hold.offer("unknown", deltas) is deltas  # never opened: not held either


def test_a_request_raises_the_interval_and_cannot_lower_it():
    raised, kept = StreamHold(2), StreamHold(3)
    raised.open("r", 3)
    kept.open("r", 1)
    steps = [step(t) for t in range(1, 8)]
    assert run(raised, steps) == [[1], None, None, [2, 3, 4], None, None, [5, 6, 7]]
    assert run(kept, steps) == [[1], None, None, [2, 3, 4], None, None, [5, 6, 7]]
    default = StreamHold(1)
    default.open("r", 2)
    assert run(default, steps[:5]) == [[1], None, [2, 3], None, [4, 5]]


def test_steps_without_tokens_before_the_first_token_go_out_at_once():
    hold = StreamHold(4)
    hold.open("r", None)
    prefill_chunk = [RequestDelta("r", [], prompt_logprobs=[])]
    assert hold.offer("r", prefill_chunk) == prefill_chunk
    assert run(hold, [step(1), step(2)]) == [[1], None]


def test_one_sample_finishing_releases_every_sample_held():
    hold = StreamHold(4)
    hold.open("r", None)
    first = hold.offer("r", step(1) + step(5, index=1))
    assert [(d.index, d.new_token_ids) for d in first] == [(0, [1]), (1, [5])]
    assert hold.offer("r", step(2) + step(6, index=1)) is None
    out = hold.offer("r", step(3) + step(7, index=1, finish="stop"))
    assert [(d.index, d.new_token_ids, d.finish_reason) for d in out] == [
        (0, [2], None),
        (1, [6], None),
        (0, [3], None),
        (1, [7], "stop"),
    ]
    # The count starts again after a release: sample 0 goes on alone.
    assert run(hold, [step(t) for t in range(4, 8)]) == [None, None, None, [4, 5, 6, 7]]


def test_close_drops_what_was_held():
    hold = StreamHold(4)
    hold.open("r", None)
    run(hold, [step(1), step(2), step(3)])
    hold.close("r")
    assert hold.offer("r", step(4)) == step(4)  # not held any more: straight through
    hold.close("never-opened")


def test_interval_below_one_is_refused():
    with pytest.raises(ValueError, match="stream interval must be >= 1, got 0"):
        StreamHold(0)
