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


_MASK64 = (1 << 64) - 1


def draw_seed(seed: int, position: int) -> int:
    """The seed of a seeded request's draw for its output token at `position`
    (splitmix64 of both): a function of nothing else, so a request resumed on another
    worker with its first tokens given draws what an undisturbed run would have."""
    x = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) & ((1 << 63) - 1)  # manual_seed takes a non-negative int64


@dataclass
class RequestState:
    req_id: str
    token_ids: list[int]  # prompt + outputs sampled so far
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    # Seeded requests only; reseeded before every draw (step_generator).
    generator: torch.Generator | None
    grammar: GrammarState | None = None  # constrained requests only
    _mask_tensors: MaskTensors | None = None

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    def step_generator(self) -> torch.Generator | None:
        """The generator for this step's draw: seeded from (seed, output position)."""
        seed = self.sampling_params.seed
        if self.generator is None or seed is None:
            return None
        return self.generator.manual_seed(draw_seed(seed, self.num_output_tokens))

    def mask_tensors(self) -> MaskTensors:
        if self._mask_tensors is None:
            self._mask_tensors = MaskTensors.of(self.sampling_params)
        return self._mask_tensors
