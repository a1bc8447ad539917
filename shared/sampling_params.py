"""Per-request sampling parameters: the one definition both services validate with.

The router checks a request with this class before any worker is bothered,
and the worker checks what arrives over gRPC with it again
(`shared.sampling_proto`), so the two can never disagree on what is valid.
Value ranges are OpenAI's documented ones where OpenAI has the field, and
vLLM's for its extras. Only token-level parameters live here: text-level
ones (stop strings, detokenizing options) are the router's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shared.errors import InvalidRequestError
from shared.structured_outputs import StructuredOutputsParams

# Below this, temperature means greedy (argmax), as in vLLM.
GREEDY_TEMPERATURE = 1e-5
MAX_LOGPROBS = 20  # vLLM's --max-logprobs default
MAX_N = 128  # OpenAI's limit on n
MAX_TEMPERATURE = 2.0  # OpenAI's documented range is [0, 2]


def _check_range(name: str, value: float, low: float, high: float, low_open: bool = False) -> None:
    if not math.isfinite(value):
        raise InvalidRequestError(name, f"must be a finite number, got {value}")
    if value < low or value > high or (low_open and value == low):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise InvalidRequestError(name, f"must be in {interval}, got {value!r}")


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token and when to stop.

    Penalties follow the documented formulas of `worker.sample.penalties`.
    `top_k` of 0 or -1 disables it. `max_tokens` None means "up to the
    model's context length". `allowed_token_ids` restricts every draw to
    those ids; `bad_words_token_ids` bans each sequence: its last token is
    banned wherever the output so far ends with the rest of it (vLLM's
    bad_words, tokenized by the router).
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
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    structured_outputs: StructuredOutputsParams | None = None
    # Delivery, not sampling (vLLM keeps it in its SamplingParams too): tokens per
    # streamed response, raising the worker's --stream-interval (worker/service/stream_hold.py).
    stream_interval: int | None = None

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> InvalidRequestError:
            return InvalidRequestError(name, f"{why}, got {getattr(self, name)!r}")

        if not isinstance(self.n, int) or not 1 <= self.n <= MAX_N:
            raise bad("n", f"must be an integer in [1, {MAX_N}]")
        _check_range("temperature", self.temperature, 0.0, MAX_TEMPERATURE)
        _check_range("top_p", self.top_p, 0.0, 1.0, low_open=True)
        if self.top_k < -1:
            raise bad("top_k", "must be -1 or 0 (disabled) or a positive integer")
        _check_range("min_p", self.min_p, 0.0, 1.0)
        _check_range("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _check_range("repetition_penalty", self.repetition_penalty, 0.0, 2.0, low_open=True)
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
        if self.stream_interval is not None and (
            not isinstance(self.stream_interval, int) or self.stream_interval < 1
        ):
            raise bad("stream_interval", "must be an integer >= 1")
        for token, bias in self.logit_bias.items():
            if not (math.isfinite(bias) and -100 <= bias <= 100):
                raise InvalidRequestError(
                    "logit_bias", f"bias for token {token} must be in [-100, 100], got {bias}"
                )
        if self.allowed_token_ids is not None:
            object.__setattr__(self, "allowed_token_ids", tuple(self.allowed_token_ids))
            if not self.allowed_token_ids:
                raise InvalidRequestError(
                    "allowed_token_ids", "must list at least one token id (or be left unset)"
                )
        words = tuple(tuple(word) for word in self.bad_words_token_ids)
        if any(not word for word in words):
            raise InvalidRequestError("bad_words", "a bad word must have at least one token")
        object.__setattr__(self, "bad_words_token_ids", words)
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
        fields: tuple[tuple[str, Sequence[int]], ...] = (
            ("logit_bias", tuple(self.logit_bias)),
            ("stop_token_ids", self.stop_token_ids),
            ("allowed_token_ids", self.allowed_token_ids or ()),
            ("bad_words", tuple(t for word in self.bad_words_token_ids for t in word)),
        )
        for name, ids in fields:
            for token in ids:
                if not 0 <= int(token) < vocab_size:
                    raise InvalidRequestError(
                        name, f"token id {token} is outside the vocabulary [0, {vocab_size})"
                    )
