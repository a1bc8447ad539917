"""Runs the model for one scheduled step and samples the next tokens.

It keeps per-request state (token ids, block table, generator) across steps,
updated from each SchedulerOutput, and makes no policy decisions.
"""

from __future__ import annotations

import torch

from shared.logging import get_logger
from worker.attention.backends import get_attention_backend
from worker.attention.forward_context import forward_context
from worker.config import EngineConfig
from worker.layers.attention import Attention
from worker.models.loader import build_model
from worker.models.spec import ModelSpec
from worker.outputs import TokenLogprobs
from worker.runner.kv_memory import allocate_kv_pool
from worker.runner.request_state import RequestState
from worker.runner.sampling_inputs import build_sampling_metadata
from worker.runner.step_inputs import StepInputs, build_step_inputs
from worker.sample.sampler import Sampler, SamplerOutput
from worker.scheduler.output import ModelRunnerOutput, SchedulerOutput

logger = get_logger(__name__)


class ModelRunner:
    def __init__(
        self,
        config: EngineConfig,
        spec: ModelSpec,
        device: torch.device,
        dtype: torch.dtype,
        max_model_len: int,
    ) -> None:
        self.spec = spec
        self.device = device
        self.dtype = dtype
        self.block_size = config.cache.block_size
        max_position = max(max_model_len, spec.max_position_embeddings)
        self.model = build_model(spec, dtype, device, max_position)
        self.backend = get_attention_backend(config.device.attention_backend, device.type)
        self.attn_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        self.requests: dict[str, RequestState] = {}
        generator = torch.Generator(device).manual_seed(config.model.seed)
        self.sampler = Sampler(generator)
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []

    @property
    def weights_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate each layer's K and V pools and bind them to its attention layer."""
        for layer in self.attn_layers:
            shape = (num_blocks, self.block_size, layer.num_kv_heads, layer.head_dim)
            # [num_blocks, block_size, num_kv_heads, head_dim] each
            kv = (
                allocate_kv_pool(shape, self.dtype, self.device),
                allocate_kv_pool(shape, self.dtype, self.device),
            )
            self.kv_caches.append(kv)
            layer.kv_cache = kv
            layer.backend = self.backend

    def _update_states(self, output: SchedulerOutput) -> None:
        for req_id in output.finished_req_ids:
            self.requests.pop(req_id, None)
        for new in output.scheduled_new_reqs:
            seed = new.sampling_params.seed
            self.requests[new.req_id] = RequestState(
                req_id=new.req_id,
                token_ids=list(new.prompt_token_ids),
                num_prompt_tokens=len(new.prompt_token_ids),
                sampling_params=new.sampling_params,
                block_ids=list(new.block_ids),
                num_computed_tokens=new.num_computed_tokens,
                generator=None if seed is None else torch.Generator(self.device).manual_seed(seed),
            )
        for cached in output.scheduled_cached_reqs:
            state = self.requests[cached.req_id]
            if cached.resumed_from_preemption:
                state.block_ids = list(cached.new_block_ids)
            else:
                state.block_ids.extend(cached.new_block_ids)
            state.num_computed_tokens = cached.num_computed_tokens

    @torch.inference_mode()
    def execute_model(self, output: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(output)
        if output.is_empty:
            return ModelRunnerOutput()
        states = [self.requests[r] for r in output.num_scheduled_tokens]
        inputs = build_step_inputs(
            states, list(output.num_scheduled_tokens.values()), self.block_size, self.device
        )
        inputs.attn_metadata.backend_plan = self.backend.prepare(inputs.attn_metadata)
        with forward_context(inputs.attn_metadata):
            hidden = self.model(inputs.input_ids, inputs.positions)  # [num_tokens, hidden_size]
        result = ModelRunnerOutput()
        if inputs.prompt_logprob_spans:
            result.prompt_logprobs = self._prompt_logprobs(hidden, inputs)
        if inputs.sample_req_ids:
            self._sample(hidden, inputs, result)
        return result

    def _sample(self, hidden: torch.Tensor, inputs: StepInputs, result: ModelRunnerOutput) -> None:
        states = [self.requests[r] for r in inputs.sample_req_ids]
        # [num_sample, vocab_size]
        # In the model's dtype: the sampler widens to float32 where it needs to.
        logits = self.model.compute_logits(hidden[inputs.logits_indices])
        meta = build_sampling_metadata(
            states, self.spec.vocab_size, self.spec.eos_token_ids, self.device
        )
        sampled = self.sampler(logits, meta)
        token_ids = sampled.token_ids.tolist()
        for state, token in zip(states, token_ids):
            state.token_ids.append(token)
            result.sampled_token_ids[state.req_id] = token
        if sampled.sampled_logprobs is not None:
            self._collect_logprobs(states, token_ids, sampled, result)

    @staticmethod
    def _collect_logprobs(
        states, token_ids, sampled: SamplerOutput, result: ModelRunnerOutput
    ) -> None:
        logprobs = sampled.sampled_logprobs.tolist()
        ranks = sampled.sampled_ranks.tolist()
        top_ids = sampled.top_token_ids.tolist() if sampled.top_token_ids is not None else None
        top_lps = sampled.top_logprobs.tolist() if sampled.top_logprobs is not None else None
        for i, state in enumerate(states):
            k = state.sampling_params.logprobs
            if k is None:
                continue
            top = tuple(zip(top_ids[i][:k], top_lps[i][:k])) if k and top_ids else ()
            result.logprobs[state.req_id] = TokenLogprobs(token_ids[i], logprobs[i], ranks[i], top)

    def _prompt_logprobs(
        self, hidden: torch.Tensor, inputs: StepInputs
    ) -> dict[str, list[TokenLogprobs]]:
        out = {}
        for req_id, (row, first_pos, count) in inputs.prompt_logprob_spans.items():
            state = self.requests[req_id]
            k = state.sampling_params.prompt_logprobs
            logprobs = torch.log_softmax(
                self.model.compute_logits(hidden[row : row + count]).float(), dim=-1
            )
            targets = torch.tensor(
                state.token_ids[first_pos + 1 : first_pos + 1 + count], device=self.device
            )
            chosen = logprobs.gather(1, targets.unsqueeze(1))
            ranks = ((logprobs > chosen).sum(dim=-1) + 1).tolist()
            top_lps, top_ids = logprobs.topk(k, dim=-1) if k else (None, None)
            chosen = chosen.squeeze(1).tolist()
            tops = list(zip(top_ids.tolist(), top_lps.tolist())) if k else None
            out[req_id] = [
                TokenLogprobs(
                    targets[j].item(), chosen[j], ranks[j], tuple(zip(*tops[j])) if tops else ()
                )
                for j in range(count)
            ]
        return out
