"""A worker's last load report, corrected by this router's own requests since."""

from __future__ import annotations

from router.routing.load_estimate import LoadEstimate
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb


def report(queued: int = 0, running: int = 0) -> wpb.GetLoadResponse:
    return wpb.GetLoadResponse(num_queued_prefill_tokens=queued, num_running_requests=running)


def test_requests_sent_after_the_report_count_until_their_first_token():
    load = LoadEstimate()
    load.update(report(queued=100, running=2), asked_at=10.0)
    ticket = load.sent(40, num_seqs=3, now=10.5)
    assert (load.num_queued_tokens, load.num_running) == (140, 2)
    load.first_token(ticket, now=10.6)
    assert (load.num_queued_tokens, load.num_running) == (100, 5)
    load.ended(ticket, now=10.9)
    assert (load.num_queued_tokens, load.num_running) == (100, 2)


def test_what_finished_since_the_report_no_longer_counts():
    load = LoadEstimate()
    queued, running = load.sent(30, 1, now=1.0), load.sent(20, 2, now=1.0)
    load.first_token(running, now=1.5)
    # The report saw `queued` waiting and `running` decoding.
    load.update(report(queued=30 + 7, running=2 + 4), asked_at=2.0)
    assert (load.num_queued_tokens, load.num_running) == (37, 6)
    load.first_token(queued, now=2.1)  # its prefill is over: no longer queued
    load.ended(running, now=2.2)  # its sequences are done
    assert (load.num_queued_tokens, load.num_running) == (7, 4 + 1)
    # A request that failed before its first token left the queue too.
    failed = load.sent(50, 1, now=2.3)
    load.update(report(queued=50), asked_at=2.4)
    load.ended(failed, now=2.5)
    assert load.num_queued_tokens == 0


def test_a_newer_report_forgets_what_it_already_reflects():
    load = LoadEstimate()
    ticket = load.sent(30, 1, now=1.0)
    load.first_token(ticket, now=1.1)
    load.ended(ticket, now=1.2)
    load.update(report(), asked_at=2.0)
    assert not load._sent
    assert (load.num_queued_tokens, load.num_running) == (0, 0)


def test_estimates_never_go_below_zero():
    load = LoadEstimate()
    ticket = load.sent(500, 1, now=1.0)
    load.update(report(queued=10), asked_at=2.0)  # the report lagged a step behind
    load.first_token(ticket, now=2.1)
    assert load.num_queued_tokens == 0
