"""What the runner remembers about each request between steps."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shared.sampling_params import SamplingParams
from worker.structured.grammar_state import GrammarState


@dataclass(frozen=True)
class MaskTensors:
    """A request's fixed logit adjustments as index tensors, built once: rebuilding
    them from the parameter dicts every step cost seconds per step for a bias
    covering the vocabulary."""

    bias_ids: torch.Tensor | None  # [num_biased] int64
    bias_values: torch.Tensor | None  # [num_biased] float32
    allowed_ids: torch.Tensor | None  # [num_allowed] int64

    @classmethod
    def of(cls, params: SamplingParams) -> MaskTensors:
        bias_ids = bias_values = allowed = None
        if params.logit_bias:
            bias_ids = torch.tensor(list(params.logit_bias), dtype=torch.int64)
            bias_values = torch.tensor(list(params.logit_bias.values()), dtype=torch.float32)
        if params.allowed_token_ids is not None:
            allowed = torch.tensor(params.allowed_token_ids, dtype=torch.int64)
        return cls(bias_ids, bias_values, allowed)


@dataclass
class RequestState:
    req_id: str
    token_ids: list[int]  # prompt + outputs sampled so far
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    generator: torch.Generator | None  # seeded requests only
    grammar: GrammarState | None = None  # constrained requests only
    _mask_tensors: MaskTensors | None = None

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    def mask_tensors(self) -> MaskTensors:
        if self._mask_tensors is None:
            self._mask_tensors = MaskTensors.of(self.sampling_params)
        return self._mask_tensors
