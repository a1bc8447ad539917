"""A worker's load as one router sees it: its last report, corrected by what this
router did since.

A report is a snapshot from when it was asked for; this router's own requests
tell what changed after that moment:

```
                      asked_at
 sent ───── first token ──┼──────────────── end      running in the report; not after end
 sent ────────────────────┼── first token            queued in the report; not any more
                          │   sent ───── (waiting)   not in the report; queued now
                          │   sent ── first token    not in the report; running now
```

so a request that finished a moment after a report no longer makes its worker
look busy, and one sent a moment after it already does. Other routers' traffic
is only known through the reports.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb


@dataclass
class _Sent:
    sent_at: float
    num_prefill_tokens: int
    num_seqs: int
    first_token_at: float | None = None
    ended_at: float | None = None

    @property
    def left_queue_at(self) -> float | None:
        """When its prefill was over (first token), or it ended without one."""
        return self.first_token_at if self.first_token_at is not None else self.ended_at


class LoadEstimate:
    def __init__(self) -> None:
        self.report = wpb.GetLoadResponse()
        self.asked_at = float("-inf")
        self._tickets = itertools.count()
        self._sent: dict[int, _Sent] = {}

    def update(self, report: wpb.GetLoadResponse, asked_at: float) -> None:
        self.report, self.asked_at = report, asked_at
        # Requests that ended before the report was asked are all in it.
        for ticket, sent in list(self._sent.items()):
            if sent.ended_at is not None and sent.ended_at < asked_at:
                del self._sent[ticket]

    def sent(self, num_prefill_tokens: int, num_seqs: int, now: float) -> int:
        ticket = next(self._tickets)
        self._sent[ticket] = _Sent(now, num_prefill_tokens, num_seqs)
        return ticket

    def first_token(self, ticket: int, now: float) -> None:
        if ticket in self._sent:
            self._sent[ticket].first_token_at = now

    def ended(self, ticket: int, now: float) -> None:
        if ticket in self._sent:
            self._sent[ticket].ended_at = now

    @property
    def num_queued_tokens(self) -> int:
        asked, done_since, unreported = self.asked_at, 0, 0
        for sent in self._sent.values():
            left = sent.left_queue_at
            if sent.sent_at < asked and left is not None and left >= asked:
                done_since += sent.num_prefill_tokens
            elif sent.sent_at >= asked and left is None:
                unreported += sent.num_prefill_tokens
        return max(self.report.num_queued_prefill_tokens - done_since, 0) + unreported

    @property
    def num_running(self) -> int:
        asked, finished_since, started_since = self.asked_at, 0, 0
        for sent in self._sent.values():
            first, ended = sent.first_token_at, sent.ended_at
            if first is not None and first < asked and ended is not None:
                finished_since += sent.num_seqs
            elif first is not None and first >= asked and ended is None:
                started_since += sent.num_seqs
        return max(self.report.num_running_requests - finished_since, 0) + started_since
