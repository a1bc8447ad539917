"""Gather per-request sampling parameters into one step's batch tensors."""

from __future__ import annotations

import torch

from worker.runner.request_state import RequestState
from worker.sample.sampler import SamplingMetadata


def _padded(rows: list[list[int]], pad: int, device: torch.device) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0) or 1
    out = torch.full((len(rows), width), pad, dtype=torch.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.int64)
    return out.to(device)


def banned_token_ids(state: RequestState, eos_token_ids: tuple[int, ...]) -> list[int]:
    """Tokens this request may not sample next: EOS and stop tokens before min_tokens,
    and the last token of every bad word whose other tokens end the output so far."""
    params = state.sampling_params
    banned: list[int] = []
    if state.num_output_tokens < params.min_tokens:
        banned.extend(eos_token_ids if not params.ignore_eos else ())
        banned.extend(params.stop_token_ids)
    if params.bad_words_token_ids:
        output = state.output_token_ids
        for word in params.bad_words_token_ids:
            head = len(word) - 1
            if head == 0 or (len(output) >= head and output[-head:] == list(word[:-1])):
                banned.append(word[-1])
    return banned


def _additive_mask(
    states: list[RequestState], vocab_size: int, eos_token_ids: tuple[int, ...]
) -> torch.Tensor | None:
    """[num_seqs, vocab_size] float32 to add to the logits: logit_bias, -inf outside
    allowed_token_ids and on banned tokens. None when no row needs one."""
    banned = [banned_token_ids(s, eos_token_ids) for s in states]
    params = [s.sampling_params for s in states]
    if not any(banned) and not any(p.logit_bias or p.allowed_token_ids for p in params):
        return None
    mask = torch.zeros(len(states), vocab_size, dtype=torch.float32)
    for row, state in enumerate(states):
        tensors = state.mask_tensors()
        if tensors.allowed_ids is not None:
            mask[row].fill_(float("-inf"))
            mask[row, tensors.allowed_ids] = 0.0
        if tensors.bias_ids is not None:
            mask[row].index_add_(0, tensors.bias_ids, tensors.bias_values)
        if banned[row]:
            mask[row, banned[row]] = float("-inf")
    return mask


def build_sampling_metadata(
    states: list[RequestState],
    vocab_size: int,
    eos_token_ids: tuple[int, ...],
    device: torch.device,
) -> SamplingMetadata:
    params = [s.sampling_params for s in states]
    greedy = [p.is_greedy for p in params]

    def column(values: list[float], dtype=torch.float32) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    meta = SamplingMetadata(
        temperature=column([1.0 if g else p.temperature for p, g in zip(params, greedy)]),
        is_greedy=column(greedy, torch.bool),
        all_greedy=all(greedy),
        top_k=column([p.top_k for p in params], torch.int64)
        if any(p.top_k > 0 for p in params)
        else None,
        top_p=column([p.top_p for p in params]) if any(p.top_p < 1 for p in params) else None,
        min_p=column([p.min_p for p in params]) if any(p.min_p > 0 for p in params) else None,
        generators={
            i: s.step_generator()
            for i, s in enumerate(states)
            if s.generator is not None and not greedy[i]
        },
    )
    if any(p.has_penalties for p in params):
        meta.prompt_ids = _padded(
            [s.token_ids[: s.num_prompt_tokens] for s in states], vocab_size, device
        )
        meta.output_ids = _padded([s.output_token_ids for s in states], vocab_size, device)
        meta.presence = column([p.presence_penalty for p in params])
        meta.frequency = column([p.frequency_penalty for p in params])
        meta.repetition = column([p.repetition_penalty for p in params])
    mask = _additive_mask(states, vocab_size, eos_token_ids)
    if mask is not None:
        meta.logit_bias = mask.to(device)
    wanted = [p.logprobs for p in params if p.logprobs is not None]
    meta.max_num_logprobs = max(wanted) if wanted else None
    return meta
