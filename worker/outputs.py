"""What the engine hands back: per-step deltas and the offline API's results."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenLogprobs:
    """The log-probability of one chosen token and the top alternatives at its position."""

    token_id: int
    logprob: float
    rank: int  # 1 = the most likely token
    top: tuple[tuple[int, float], ...] = ()  # (token_id, logprob), most likely first


@dataclass
class RequestDelta:
    """One step's news about one request, as the service streams it."""

    request_id: str
    new_token_ids: list[int]
    index: int = 0  # which of the request's n samples
    new_logprobs: list[TokenLogprobs] | None = None
    # Prompt positions completed this step; the first prompt token has none.
    prompt_logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | None = None  # the stop token id that ended it, if any
    num_cached_tokens: int = 0
    num_prompt_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | None = None
    text: str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    prompt: str | None = None

    @property
    def finished(self) -> bool:
        return all(o.finish_reason is not None for o in self.outputs)
