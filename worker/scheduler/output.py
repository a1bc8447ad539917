"""The hand-offs between the scheduler and the model runner.

`SchedulerOutput` is everything the runner learns about requests; the
runner's answer is `ModelRunnerOutput`. Nothing else crosses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shared.sampling_params import SamplingParams
from worker.outputs import TokenLogprobs


@dataclass(frozen=True)
class NewRequestData:
    """A request the runner has not seen: everything it needs to keep its own state."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int  # prefix-cache hit
    grammar: Any = None  # compiled, when sampling_params.structured_outputs is set
    # Tokens generated before the request came here (resumed from a failed worker).
    output_token_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class CachedRequestData:
    """A request the runner already tracks: only what changed."""

    req_id: str
    new_block_ids: list[int]  # appended to its block table; the whole table if resumed
    num_computed_tokens: int
    resumed_from_preemption: bool = False


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: list[CachedRequestData]
    # Batch order is this dict's order.
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    # Requests that left since the last step; the runner drops their state.
    finished_req_ids: set[str] = field(default_factory=set)
    preempted_req_ids: set[str] = field(default_factory=set)

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


@dataclass
class ModelRunnerOutput:
    # Only requests whose computed tokens reached their end this step sample.
    sampled_token_ids: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    # Prompt positions whose logprobs were computed this step, per request.
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    # Requests whose grammar ended with this step's token (or refused it).
    grammar_ended: set[str] = field(default_factory=set)
