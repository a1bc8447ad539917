"""Per-request sampling parameters, validated where they are made."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.errors import InvalidRequestError

# Below this, temperature means greedy (argmax), as in vLLM.
GREEDY_TEMPERATURE = 1e-5
MAX_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token and when to stop.

    Penalties follow the documented formulas of `worker.sample.penalties`.
    `top_k` of 0 or -1 disables it. `max_tokens` None means "up to the
    model's context length".
    """

    n: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> InvalidRequestError:
            return InvalidRequestError(name, f"{why}, got {getattr(self, name)!r}")

        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", "must be an integer >= 1")
        if self.temperature < 0:
            raise bad("temperature", "must be >= 0")
        if not 0 < self.top_p <= 1:
            raise bad("top_p", "must be in (0, 1]")
        if self.top_k < -1:
            raise bad("top_k", "must be -1 or 0 (disabled) or a positive integer")
        if not 0 <= self.min_p <= 1:
            raise bad("min_p", "must be in [0, 1]")
        if not -2 <= self.presence_penalty <= 2:
            raise bad("presence_penalty", "must be in [-2, 2]")
        if not -2 <= self.frequency_penalty <= 2:
            raise bad("frequency_penalty", "must be in [-2, 2]")
        if not 0 < self.repetition_penalty <= 2:
            raise bad("repetition_penalty", "must be in (0, 2]")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise bad("max_tokens", "must be >= 1")
        if self.min_tokens < 0:
            raise bad("min_tokens", "must be >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"must be <= max_tokens ({self.max_tokens})")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                raise bad(name, f"must be in [0, {MAX_LOGPROBS}]")
        for token, bias in self.logit_bias.items():
            if not -100 <= bias <= 100:
                raise InvalidRequestError(
                    "logit_bias", f"bias for token {token} must be in [-100, 100], got {bias}"
                )
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def has_penalties(self) -> bool:
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
        )

    def validate_token_ids(self, vocab_size: int) -> None:
        for name, ids in (("logit_bias", self.logit_bias), ("stop_token_ids", self.stop_token_ids)):
            for token in ids:
                if not 0 <= int(token) < vocab_size:
                    raise InvalidRequestError(
                        name, f"token id {token} is outside the vocabulary [0, {vocab_size})"
                    )
