"""Runs the model for one scheduled step and samples the next tokens.

It keeps per-request state (token ids, block table, generator) across steps,
updated from each SchedulerOutput, and makes no policy decisions.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from shared.errors import ConfigError
from shared.logging import get_logger
from worker.attention.backends import get_attention_backend
from worker.attention.forward_context import forward_context
from worker.attention.metadata import BatchLayout
from worker.config import EngineConfig
from worker.layers.attention import Attention
from worker.layers.quantization import resolve_quantization
from worker.models.loader import build_model
from worker.models.spec import ModelSpec
from worker.models.weight_memory import resident_weight_bytes
from worker.outputs import TokenLogprobs
from worker.runner.cuda_graphs import CUDAGraphRunner, GraphCapture, capture_sizes
from worker.runner.kv_memory import allocate_kv_pool, kv_cache_dtype
from worker.runner.persistent_batch import PersistentBatch
from worker.runner.request_state import RequestState
from worker.runner.sampling_inputs import build_sampling_metadata
from worker.runner.staging import StepStaging
from worker.runner.step_inputs import StepInputs
from worker.sample.sampler import Sampler, SamplingMetadata
from worker.scheduler.output import ModelRunnerOutput, SchedulerOutput
from worker.structured.bitmask import apply_bitmask, fill_bitmask
from worker.structured.grammar_state import GrammarState

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
        self.config = config
        self.spec = spec
        self.device = device
        self.dtype = dtype
        self.block_size = config.cache.block_size
        max_position = max(max_model_len, spec.max_position_embeddings)
        # Resolved before anything loads: an unservable format fails at start.
        quant_config = resolve_quantization(spec.quantization_config, config.model.quantization)
        self.backend = get_attention_backend(config.device.attention_backend, device)
        # A half checkpoint that --dtype auto runs in float32 on this CPU keeps its K/V
        # half under auto where the backend reads such a cache (else float32, as named).
        widened_from = (
            spec.checkpoint_dtype
            if config.model.dtype == "auto" and self.backend.half_kv_under_float32
            else None
        )
        self.kv_dtype = kv_cache_dtype(config.cache.kv_cache_dtype, dtype, widened_from)
        if self.kv_dtype != dtype and config.cache.kv_cache_dtype == "auto":
            logger.info(
                "KV cache in %s, the checkpoint's dtype, under the float32 model "
                "(--kv-cache-dtype float32 keeps it float32)",
                str(self.kv_dtype).removeprefix("torch."),
            )
        if not self.backend.supports_kv_dtype(self.kv_dtype, dtype):
            raise ConfigError(
                f"--kv-cache-dtype {config.cache.kv_cache_dtype} is not supported by the "
                f"{self.backend.name} attention backend for a {dtype} model (it reads "
                f"{dtype} or fp8 caches, and bf16/fp16 ones only under float32 on CPU); "
                "use --kv-cache-dtype auto"
            )
        self.model = build_model(spec, dtype, device, max_position, quant_config)
        self.attn_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        self.requests: dict[str, RequestState] = {}
        generator = torch.Generator(device).manual_seed(config.model.seed)
        self.sampler = Sampler(generator)
        self.kv_caches: list[torch.Tensor] = []
        self.staging = StepStaging(device)
        self.batch = PersistentBatch(self.block_size)
        self.max_num_blocks = -(-max_model_len // self.block_size)
        self.graphs: CUDAGraphRunner | None = None

    @property
    def weights_bytes(self) -> int:
        return resident_weight_bytes(self.model)

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate each layer's KV cache, in the backend's layout, and bind it."""
        for layer in self.attn_layers:
            shape = self.backend.kv_cache_shape(
                num_blocks, self.block_size, layer.num_kv_heads, layer.head_dim
            )
            kv = allocate_kv_pool(shape, self.kv_dtype, self.device)
            self.kv_caches.append(kv)
            layer.kv_cache = kv
            layer.backend = self.backend

    @torch.inference_mode()
    def profile_run(self) -> int:
        """One forward of --max-num-batched-tokens tokens (max-num-seqs sequences
        of about equal length) and a top-k/top-p sampler pass over their rows, on
        a throwaway one-block cache (the real one is untouched); returns the peak
        bytes allocated above what was allocated before (0 off CUDA)."""
        budget = self.config.scheduler
        num_tokens = budget.max_num_batched_tokens
        num_seqs = max(1, min(budget.max_num_seqs, num_tokens))
        lens = np.full(num_seqs, num_tokens // num_seqs, dtype=np.int64)
        lens[: num_tokens % num_seqs] += 1
        query_start_loc = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        width = -(-int(lens.max()) // self.block_size)
        positions = np.concatenate([np.arange(n) for n in lens]).astype(np.int64)
        layout = BatchLayout(  # every token reads and writes block 0 of a throwaway cache
            query_start_loc=query_start_loc,
            seq_lens=lens.astype(np.int32),
            block_tables=np.zeros((num_seqs, width), dtype=np.int32),
            slot_mapping=positions % self.block_size,
        )
        is_cuda = self.device.type == "cuda"
        if is_cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            before = torch.cuda.memory_allocated(self.device)
        bound = [layer.kv_cache for layer in self.attn_layers]
        for layer in self.attn_layers:
            shape = self.backend.kv_cache_shape(
                1, self.block_size, layer.num_kv_heads, layer.head_dim
            )
            layer.kv_cache, layer.backend = (
                torch.zeros(shape, dtype=self.kv_dtype, device=self.device),
                self.backend,
            )
        try:
            arrays = {
                "input_ids": np.zeros(num_tokens, dtype=np.int64),
                "positions": positions,
                **self.backend.device_arrays(layout),
                "logits_indices": (query_start_loc[1:] - 1).astype(np.int64),
            }
            tensors = self.staging.upload(arrays).tensors
            with forward_context(self.backend.build_metadata(layout, tensors)):
                hidden = self.model(tensors["input_ids"], tensors["positions"])
            logits = self.model.compute_logits(hidden[tensors["logits_indices"]])
            rows = torch.ones(num_seqs, device=self.device)
            meta = SamplingMetadata(
                temperature=rows,
                is_greedy=rows < 0,
                all_greedy=False,
                top_k=torch.full((num_seqs,), 50, dtype=torch.int64, device=self.device),
                top_p=rows * 0.9,
                min_p=None,
                generators={},
            )
            self.sampler(logits, meta)
            del hidden, logits
        finally:
            for layer, kv in zip(self.attn_layers, bound):
                layer.kv_cache = kv
        if not is_cuda:
            return 0
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device) - before

    def cuda_graphs_wanted(self) -> bool:
        """Graphs on a GPU unless --enforce-eager, where the backend can replay."""
        return (
            self.device.type == "cuda"
            and not self.config.device.enforce_eager
            and self.backend.supports_cuda_graphs
        )

    def capture_cuda_graphs(self, capture: GraphCapture | None = None) -> None:
        """Capture the decode graphs (after initialize_kv_cache: they bind its caches)."""
        budget = self.config.scheduler
        sizes = [
            s
            for s in capture_sizes(budget.max_num_seqs)
            if s <= max(budget.max_num_batched_tokens, 1)
        ]
        self.graphs = CUDAGraphRunner(
            self.model, self.backend, self.device, sizes, self.max_num_blocks, capture
        )
        self.graphs.capture_all()

    def _update_states(self, output: SchedulerOutput) -> None:
        if output.finished_req_ids or output.scheduled_new_reqs:
            self.batch.forget()  # its rows' requests changed
        for req_id in output.finished_req_ids:
            self.requests.pop(req_id, None)
        for new in output.scheduled_new_reqs:
            seed = new.sampling_params.seed
            self.requests[new.req_id] = RequestState(
                req_id=new.req_id,
                token_ids=list(new.prompt_token_ids) + list(new.output_token_ids),
                num_prompt_tokens=len(new.prompt_token_ids),
                sampling_params=new.sampling_params,
                block_ids=list(new.block_ids),
                num_computed_tokens=new.num_computed_tokens,
                generator=None if seed is None else torch.Generator(self.device).manual_seed(seed),
                grammar=None if new.grammar is None else GrammarState(new.grammar),
            )
            state = self.requests[new.req_id]
            if state.grammar is not None and new.output_token_ids:
                # Resumed from a failed worker: its matcher walks the tokens made there.
                state.grammar.rebuild(state.output_token_ids)
        for cached in output.scheduled_cached_reqs:
            state = self.requests[cached.req_id]
            if cached.resumed_from_preemption:
                self.batch.forget()
                state.block_ids = list(cached.new_block_ids)
                if state.grammar is not None:  # recomputed from its tokens, so is its matcher
                    state.grammar.rebuild(state.output_token_ids)
            else:
                state.block_ids.extend(cached.new_block_ids)
            state.num_computed_tokens = cached.num_computed_tokens

    @torch.inference_mode()
    def execute_model(self, output: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(output)
        if output.is_empty:
            return ModelRunnerOutput()
        req_ids = tuple(output.num_scheduled_tokens)
        states = [self.requests[r] for r in req_ids]
        inputs = self.batch.step_inputs(req_ids, states, list(output.num_scheduled_tokens.values()))
        graph_size = self.graphs.size_for(inputs) if self.graphs is not None else None
        if graph_size is not None:
            inputs = inputs.padded(graph_size, self.graphs.max_num_blocks)
        # Sampling rows are a subsequence of the batch's: as many means all of them.
        sample_states = (
            states
            if len(inputs.sample_req_ids) == len(states)
            else [self.requests[r] for r in inputs.sample_req_ids]
        )
        sampling = (
            self.batch.sampling(sample_states, self._build_sampling) if sample_states else None
        )
        # On CPU the staged tensors are the host arrays: the sampling tensors,
        # already there, are used as they are instead of round-tripping through numpy.
        stage_sampling = sampling is not None and not self.staging.is_zero_copy
        staged = self.staging.upload(
            self._step_arrays(inputs, sampling if stage_sampling else None)
        )
        tensors = staged.tensors
        if graph_size is not None:
            hidden = self.graphs.replay(graph_size, staged)  # [graph_size, hidden_size]
        else:
            metadata = self.backend.build_metadata(inputs.layout, tensors)
            with forward_context(metadata):
                hidden = self.model(tensors["input_ids"], tensors["positions"])
        result = ModelRunnerOutput()
        if inputs.prompt_logprob_spans:
            result.prompt_logprobs = self._prompt_logprobs(hidden, inputs, tensors)
        if sampling is not None:
            meta = _on_device(sampling, tensors) if stage_sampling else sampling
            self._sample(hidden, sample_states, meta, tensors, result)
        return result

    def _build_sampling(self, states: list[RequestState]) -> SamplingMetadata:
        return build_sampling_metadata(
            states, self.spec.vocab_size, self.spec.eos_token_ids, torch.device("cpu")
        )

    def _step_arrays(
        self, inputs: StepInputs, sampling: SamplingMetadata | None
    ) -> dict[str, np.ndarray]:
        """Everything the step reads on the device, for its one copy. A graph's
        inputs go first, in the order the capture staged them (cuda_graphs.py)."""
        arrays = {
            "input_ids": inputs.input_ids,
            "positions": inputs.positions,
            **self.backend.device_arrays(inputs.layout),
            "logits_indices": inputs.logits_indices,
        }
        if inputs.prompt_logprob_spans:
            arrays["prompt_targets"] = self._prompt_targets(inputs)
        if sampling is not None:
            for field in dataclasses.fields(sampling):
                value = getattr(sampling, field.name)
                if isinstance(value, torch.Tensor):
                    arrays[f"sampling.{field.name}"] = value.numpy()
        return arrays

    def _sample(
        self,
        hidden: torch.Tensor,
        states: list[RequestState],
        meta: SamplingMetadata,
        tensors: dict[str, torch.Tensor],
        result: ModelRunnerOutput,
    ) -> None:
        rows = tensors["logits_indices"]
        # Every row samples (a decode step): the hidden states are the rows, no gather.
        selected = hidden if rows.shape[0] == hidden.shape[0] else hidden[rows]
        # [num_sample, vocab_size]
        # In the model's dtype: the sampler widens to float32 where it needs to.
        logits = self.model.compute_logits(selected)
        constrained = [i for i, s in enumerate(states) if s.grammar is not None]
        if constrained:  # before any sampling path, greedy argmax included
            bitmask = fill_bitmask([states[i].grammar for i in constrained], logits.shape[1])
            logits = apply_bitmask(logits, bitmask.to(logits.device), constrained)
        sampled = self.sampler(logits, meta)
        if sampled.sampled_logprobs is None:
            host = None
            token_ids = sampled.token_ids.tolist()  # the step's one copy back
        else:
            # The step's one copy back: token ids and logprobs in one float64 block.
            columns = [
                sampled.token_ids.unsqueeze(1),
                sampled.sampled_logprobs.unsqueeze(1),
                sampled.sampled_ranks.unsqueeze(1),
            ]
            if sampled.top_token_ids is not None:
                columns += [sampled.top_token_ids, sampled.top_logprobs]
            host = torch.cat([c.double() for c in columns], dim=1).cpu().tolist()
            token_ids = [int(row[0]) for row in host]
        for i in constrained:
            token_ids[i] = self._follow_grammar(states[i], token_ids[i], result)
        for state, token in zip(states, token_ids):
            state.token_ids.append(token)
        result.sampled_token_ids = dict(zip([s.req_id for s in states], token_ids))
        if host is not None:
            self._collect_logprobs(states, token_ids, host, result)

    def _follow_grammar(self, state: RequestState, token: int, result: ModelRunnerOutput) -> int:
        """Advance the request's matcher; the token it gets (EOS when the grammar
        refuses the sampled one)."""
        if state.grammar.accept(token):
            if state.grammar.is_terminated:
                result.grammar_ended.add(state.req_id)
            return token
        # NOTE: only when every token was masked: min_tokens banned the EOS that a
        # finished grammar allows alone. The grammar wins: the answer ends, valid.
        result.grammar_ended.add(state.req_id)
        eos = self.spec.eos_token_ids
        logger.debug("request %s: grammar ended before min_tokens", state.req_id)
        return eos[0] if eos else token

    @staticmethod
    def _collect_logprobs(states, token_ids, host: list[list[float]], result) -> None:
        logprobs = [row[1] for row in host]
        ranks = [int(row[2]) for row in host]
        width = (len(host[0]) - 3) // 2
        top_ids = [[int(t) for t in row[3 : 3 + width]] for row in host] if width else None
        top_lps = [row[3 + width :] for row in host] if width else None
        for i, state in enumerate(states):
            k = state.sampling_params.logprobs
            if k is None:
                continue
            top = tuple(zip(top_ids[i][:k], top_lps[i][:k])) if k and top_ids else ()
            result.logprobs[state.req_id] = TokenLogprobs(token_ids[i], logprobs[i], ranks[i], top)

    def _prompt_targets(self, inputs: StepInputs) -> np.ndarray:
        """The prompt tokens each prompt-logprob row scores, span after span."""
        targets = []
        for req_id, (_, first_pos, count) in inputs.prompt_logprob_spans.items():
            targets += self.requests[req_id].token_ids[first_pos + 1 : first_pos + 1 + count]
        return np.asarray(targets, dtype=np.int64)

    def _prompt_logprobs(
        self, hidden: torch.Tensor, inputs: StepInputs, tensors: dict[str, torch.Tensor]
    ) -> dict[str, list[TokenLogprobs]]:
        out, offset = {}, 0
        for req_id, (row, _, count) in inputs.prompt_logprob_spans.items():
            k = self.requests[req_id].sampling_params.prompt_logprobs
            logprobs = torch.log_softmax(
                self.model.compute_logits(hidden[row : row + count]).float(), dim=-1
            )
            targets = tensors["prompt_targets"][offset : offset + count]
            offset += count
            chosen = logprobs.gather(1, targets.unsqueeze(1))
            columns = [
                targets.unsqueeze(1),
                chosen,
                (logprobs > chosen).sum(dim=-1, keepdim=True) + 1,
            ]
            if k:
                top_lps, top_ids = logprobs.topk(k, dim=-1)
                columns += [top_ids, top_lps]
            host = torch.cat([c.double() for c in columns], dim=1).cpu().tolist()  # one copy back
            out[req_id] = [
                TokenLogprobs(
                    int(r[0]),
                    r[1],
                    int(r[2]),
                    tuple(zip((int(t) for t in r[3 : 3 + k]), r[3 + k :])) if k else (),
                )
                for r in host
            ]
        return out


def _on_device(meta: SamplingMetadata, tensors: dict[str, torch.Tensor]) -> SamplingMetadata:
    """`meta` with its tensors replaced by their staged device copies."""
    changes = {
        f.name: tensors[f"sampling.{f.name}"]
        for f in dataclasses.fields(meta)
        if f"sampling.{f.name}" in tensors
    }
    return dataclasses.replace(meta, **changes)
