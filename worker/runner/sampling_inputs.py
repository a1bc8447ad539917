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
            i: s.generator
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

    banned = [
        (eos_token_ids if not p.ignore_eos else ()) + p.stop_token_ids
        if s.num_output_tokens < p.min_tokens
        else ()
        for s, p in zip(states, params)
    ]
    if any(p.logit_bias for p in params) or any(banned):
        bias = torch.zeros(len(states), vocab_size, dtype=torch.float32)
        for i, p in enumerate(params):
            for token, value in p.logit_bias.items():
                bias[i, int(token)] += value
            bias[i, list(banned[i])] = float("-inf")
        meta.logit_bias = bias.to(device)

    wanted = [p.logprobs for p in params if p.logprobs is not None]
    meta.max_num_logprobs = max(wanted) if wanted else None
    return meta
