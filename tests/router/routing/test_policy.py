"""Routing choices, exactly: the lowest estimated time to first token wins."""

from __future__ import annotations

import pytest

from router.routing.policy import (
    AFFINITY,
    LOAD,
    MISS,
    NO_STORE,
    REPLICATE,
    Candidate,
    choose,
    estimate_cost,
)


def test_the_worker_holding_the_prefix_wins_when_both_are_idle():
    decision = choose([Candidate("a"), Candidate("b", num_matched_tokens=32)], 40)
    assert (decision.worker_id, decision.reason, decision.cost) == ("b", AFFINITY, 8)
    assert decision.num_matched_tokens == 32


def test_a_busy_owner_loses_to_an_idle_worker_and_the_prefix_is_replicated():
    owner = Candidate("a", num_matched_tokens=32, num_queued_tokens=100)
    decision = choose([owner, Candidate("b")], 40)
    assert (decision.worker_id, decision.reason, decision.cost) == ("b", REPLICATE, 40)
    # ... but not while its queue is worth less than the prefix.
    owner = Candidate("a", num_matched_tokens=32, num_queued_tokens=31)
    assert choose([owner, Candidate("b")], 40).worker_id == "a"


def test_misses_go_to_the_shortest_queue_counting_running_sequences():
    workers = [
        Candidate("a", num_queued_tokens=10, num_running=5),
        Candidate("b", num_queued_tokens=12),
        Candidate("c", num_queued_tokens=0, num_running=20),
    ]
    decision = choose(workers, 16)
    assert (decision.worker_id, decision.reason, decision.cost) == ("b", MISS, 28)


def test_equal_costs_spread_by_requests_sent_then_by_id():
    assert choose([Candidate("a", num_sent=3), Candidate("b", num_sent=2)], 8).worker_id == "b"
    assert choose([Candidate("b", num_sent=2), Candidate("a", num_sent=2)], 8).worker_id == "a"


def test_a_whole_prompt_match_still_computes_one_token():
    assert estimate_cost(Candidate("a", num_matched_tokens=16), 16) == 1
    assert estimate_cost(Candidate("a", num_matched_tokens=64), 16) == 1


@pytest.mark.parametrize("reason", [LOAD, NO_STORE])
def test_a_fallback_labels_the_decision(reason):
    decision = choose([Candidate("a", num_queued_tokens=5), Candidate("b")], 8, reason)
    assert (decision.worker_id, decision.reason) == ("b", reason)


def test_no_candidates_is_an_error():
    with pytest.raises(ValueError):
        choose([], 8)


def test_a_prefix_below_the_threshold_is_a_miss():
    # 8 of 40 prompt tokens (a shared template head) do not pull the request to "a".
    workers = [Candidate("a", num_matched_tokens=8, num_sent=1), Candidate("b")]
    decision = choose(workers, 40, affinity_threshold=0.3)
    assert (decision.worker_id, decision.reason, decision.num_matched_tokens) == ("b", MISS, 0)
    workers = [Candidate("a", num_matched_tokens=12, num_sent=1), Candidate("b")]
    assert choose(workers, 40, affinity_threshold=0.3).reason == AFFINITY
