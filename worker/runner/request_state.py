"""What the runner remembers about each request between steps."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.engine.sampling_params import SamplingParams


@dataclass
class RequestState:
    req_id: str
    token_ids: list[int]  # prompt + outputs sampled so far
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    generator: torch.Generator | None  # seeded requests only

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]
