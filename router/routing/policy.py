"""Which worker gets a request: the lowest estimated time to first token.

Pure functions over plain numbers, so the choices can be tested exactly. The
estimate counts tokens the worker must run through the model before this
request's first token comes out:

```
cost(w) = uncached prompt tokens     prompt - prefix w likely holds (from Redis / choices)
        + queued prefill tokens      w's last report + what this router sent since
        + running sequences          one decode token each, in the step that runs it
```

A cached prefix lowers the cost by its length, so affinity wins until the
owner's queue is longer than the prefix is worth; then a second worker takes
the prompt and the hot prefix is replicated. Cache misses go where the
queues are shortest; among equal costs, to the worker this router has sent
the fewest requests, so an idle cluster still spreads them.

NOTE: a prefix shorter than `affinity_threshold` of the prompt does not
count (as in SGLang's cache-aware router): a head every prompt shares, such
as a chat template's opening or a short system prompt, would otherwise pull
every new conversation to the first worker that saw it, and the
conversations would stay there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

# Why a worker was chosen (the label of the routing-decision metric).
AFFINITY = "affinity"  # it holds the longest cached prefix of the prompt
REPLICATE = "replicate"  # another holds more, but is too busy: the prefix is copied
MISS = "miss"  # nobody holds any of it: least loaded
LOAD = "load"  # --routing-policy load: affinity ignored
NO_STORE = "no_store"  # the affinity store (Redis) is unreachable: least loaded
REASONS = (AFFINITY, REPLICATE, MISS, LOAD, NO_STORE)


@dataclass(frozen=True)
class Candidate:
    worker_id: str
    num_matched_tokens: int = 0  # leading prompt tokens it likely holds in its cache
    num_queued_tokens: int = 0  # prefill tokens queued ahead of a new request
    num_running: int = 0  # sequences it is decoding
    num_sent: int = 0  # requests this router has sent it (tie-break only)


@dataclass(frozen=True)
class Decision:
    worker_id: str
    reason: str
    cost: int  # estimated tokens before the first token
    num_matched_tokens: int


def estimate_cost(candidate: Candidate, num_prompt_tokens: int) -> int:
    # NOTE: the worker's prefix lookup stops one token short of the prompt so that
    # the last token still produces logits: at least one token is always computed.
    matched = min(candidate.num_matched_tokens, num_prompt_tokens - 1)
    uncached = max(num_prompt_tokens - max(matched, 0), 1)
    return uncached + candidate.num_queued_tokens + candidate.num_running


def choose(
    candidates: Sequence[Candidate],
    num_prompt_tokens: int,
    fallback_reason: str | None = None,
    affinity_threshold: float = 0.0,
) -> Decision:
    """Pick the cheapest candidate. `fallback_reason` (LOAD or NO_STORE) says the
    matches are unknown (every num_matched_tokens is 0) and labels the decision."""
    if not candidates:
        raise ValueError("no candidates to choose from")
    longest = max(c.num_matched_tokens for c in candidates)
    if longest < affinity_threshold * num_prompt_tokens:  # too short to matter: a miss
        candidates = [dataclasses.replace(c, num_matched_tokens=0) for c in candidates]
    costs = {c.worker_id: estimate_cost(c, num_prompt_tokens) for c in candidates}
    best = min(candidates, key=lambda c: (costs[c.worker_id], c.num_sent, c.worker_id))
    if fallback_reason is not None:
        reason = fallback_reason
    else:
        longest = max(c.num_matched_tokens for c in candidates)
        if longest == 0:
            reason = MISS
        elif best.num_matched_tokens == longest:
            reason = AFFINITY
        else:
            reason = REPLICATE
    return Decision(best.worker_id, reason, costs[best.worker_id], best.num_matched_tokens)
