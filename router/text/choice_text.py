"""One choice's token stream turned into text deltas: detokenize, then cut at stop strings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from router.text.detokenizer import Decoder, IncrementalDetokenizer
from router.text.stop import StopChecker
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb

FINISH_REASONS = {
    wpb.FINISH_REASON_STOP: "stop",
    wpb.FINISH_REASON_LENGTH: "length",
    wpb.FINISH_REASON_ABORT: "abort",
}


@dataclass(frozen=True)
class TextOptions:
    """How a choice's tokens become text (the router's part of SamplingParams)."""

    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    min_tokens: int = 0  # stop strings count only from this many tokens on


@dataclass
class TextDelta:
    """What one choice produced since its previous delta."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[wpb.TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: str | int | None = None  # the stop string or stop token id


class ChoiceText:
    def __init__(
        self,
        index: int,
        decoder: Decoder,
        prompt_token_ids: Sequence[int],
        options: TextOptions = TextOptions(),
    ) -> None:
        self.index = index
        self._detokenizer = IncrementalDetokenizer(
            decoder,
            prompt_token_ids,
            options.skip_special_tokens,
            options.spaces_between_special_tokens,
        )
        self._stop = StopChecker(options.stop, options.include_stop_str_in_output)
        self._min_tokens = options.min_tokens
        self.num_tokens = 0
        self.is_finished = False

    def push(self, output: wpb.SampleOutput) -> TextDelta | None:
        """Fold one worker output in; None once the choice has finished (a stop string
        may end it before the worker does; later tokens are not part of it)."""
        if self.is_finished:
            return None
        token_ids = list(output.token_ids)
        has_logprobs = len(output.logprobs) == len(token_ids)
        delta = TextDelta(self.index, "", [])
        # With stop strings, tokens go one at a time so that the count stops at the
        # token that completed the stop string.
        step = 1 if self._stop.stop else max(len(token_ids), 1)
        for start in range(0, len(token_ids), step):
            chunk = token_ids[start : start + step]
            delta.token_ids.extend(chunk)
            if has_logprobs:
                delta.logprobs.extend(output.logprobs[start : start + step])
            self.num_tokens += len(chunk)
            if self.num_tokens < self._min_tokens:
                # As vLLM: stop strings count from the min_tokens-th token on.
                delta.text += self._detokenizer.push(chunk)
                continue
            text, stop = self._stop.push(self._detokenizer.push(chunk))
            delta.text += text
            if stop is not None:
                delta.finish_reason, delta.stop_reason = "stop", stop
                self.is_finished = True
                return delta
        if output.finish_reason != wpb.FINISH_REASON_UNSPECIFIED:
            text, stop = self._stop.push(self._detokenizer.flush())
            delta.text += text
            if stop is not None:
                delta.finish_reason, delta.stop_reason = "stop", stop
            else:
                delta.text += self._stop.flush()
                delta.finish_reason = FINISH_REASONS[output.finish_reason]
                if output.HasField("stop_token_id"):
                    delta.stop_reason = output.stop_token_id
            self.is_finished = True
        return delta
