"""A request as the engine tracks it: tokens so far, progress, status."""

from __future__ import annotations

import enum
import time
from typing import Any

from shared.block_hash import BlockHash, extend_block_hashes
from shared.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    # Everything from here on is finished.
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


class Request:
    """Token-level progress of one sequence.

    ```
    all_token_ids:  | prompt ............ | outputs ...... |
    num_computed:   |<-- KV in cache -->|
                                         ^ next tokens to compute this step
    ```
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_ids: tuple[int, ...] = (),
        max_tokens: int = 16,
        priority: int = 0,
        arrival_time: float | None = None,
        block_size: int | None = None,
        cache_salt: bytes | None = None,
        grammar: Any = None,
        output_token_ids: list[int] | None = None,
    ) -> None:
        """grammar: the compiled grammar of sampling_params.structured_outputs.
        output_token_ids: tokens a failed worker generated already (a resumed
        request); they count as this request's own outputs."""
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.eos_token_ids = eos_token_ids
        self.max_tokens = max_tokens
        self.priority = priority
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.num_prompt_tokens = len(prompt_token_ids)
        self.output_token_ids: list[int] = list(output_token_ids or ())
        self.all_token_ids = list(prompt_token_ids) + self.output_token_ids
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1  # set when first scheduled
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.stop_reason: int | None = None
        self.cache_salt = cache_salt
        self.grammar = grammar
        self._block_size = block_size
        self.block_hashes: list[BlockHash] = []
        self._update_block_hashes()

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.all_token_ids[: self.num_prompt_tokens]

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def _update_block_hashes(self) -> None:
        if self._block_size is not None:
            extend_block_hashes(
                self.block_hashes, self.all_token_ids, self._block_size, self.cache_salt
            )

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        # NOTE: block_hashes always covers every full block, so only a token that
        # fills a block adds a hash (the call costs ~1 us a token otherwise).
        if self._block_size is not None and len(self.all_token_ids) % self._block_size == 0:
            self._update_block_hashes()

    def check_stop(self, grammar_ended: bool = False) -> bool:
        """After a token was appended: decide whether the request is done.
        grammar_ended: its grammar accepts nothing more (e.g. under ignore_eos)."""
        params = self.sampling_params
        num_out = len(self.output_token_ids)
        last = self.output_token_ids[-1]
        if grammar_ended:
            self.status = RequestStatus.FINISHED_STOPPED
            return True
        if num_out >= params.min_tokens:
            if not params.ignore_eos and last in self.eos_token_ids:
                self.status = RequestStatus.FINISHED_STOPPED
                return True
            if last in params.stop_token_ids:
                self.status = RequestStatus.FINISHED_STOPPED
                self.stop_reason = last
                return True
        if num_out >= self.max_tokens:
            self.status = RequestStatus.FINISHED_LENGTH
            return True
        return False
