"""Offline batch generation over the same engine the worker service runs."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from shared.errors import InvalidRequestError
from shared.sampling_params import SamplingParams
from worker.config import EngineConfig
from worker.engine.llm_engine import LLMEngine
from worker.outputs import CompletionOutput, RequestDelta, RequestOutput
from worker.service.primitive_caches import bound_primitive_caches
from worker.stats import SchedulerStats

PromptInput = str | Sequence[int]


class LLM:
    """`LLM(model=...).generate(prompts, params)`.

    Engine options are keyword arguments named like the CLI flags
    (`max_num_seqs=...`, `enable_prefix_caching=False`, ...).
    """

    def __init__(
        self, model: str | None = None, config: EngineConfig | None = None, **engine_options: Any
    ) -> None:
        if config is None:
            if model is None:
                raise TypeError("LLM() needs a model (or a ready EngineConfig as config=)")
            config = EngineConfig.from_kwargs(model=model, **engine_options)
        # Before the engine's first linear: oneDNN reads the caps at its first call
        # (worker/service/primitive_caches.py); a long offline run meets as many
        # token counts as a serving worker does.
        bound_primitive_caches()
        self.engine = LLMEngine(config, offline=True)
        self._tokenizer = None
        self._ids = itertools.count()
        self.last_stats: SchedulerStats | None = None

    def get_tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            path = self.engine.config.model.tokenizer or str(self.engine.spec.path)
            try:
                self._tokenizer = AutoTokenizer.from_pretrained(path)
            except (OSError, ValueError) as exc:
                raise InvalidRequestError(
                    "prompt", f"text prompts need a tokenizer, and none loads from {path}: {exc}"
                ) from exc
        return self._tokenizer

    def shutdown(self) -> None:
        """Stop the tensor-parallel rank processes now (else they stop at exit), or
        at TP 1 free the model, KV cache and CUDA graphs (a GPU's memory goes back
        to the device for the next engine). The LLM is unusable afterwards."""
        self.engine.shutdown()

    def get_default_sampling_params(self) -> SamplingParams:
        """The parameters `generate` uses when given none: the model's
        generation_config.json recommendations (--generation-config) over the defaults."""
        return self.engine.default_sampling_params()

    def _to_token_ids(self, prompt: PromptInput) -> list[int]:
        if isinstance(prompt, str):
            return self.get_tokenizer().encode(prompt)
        return list(prompt)

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        priority: Sequence[int] | None = None,
        detokenize: bool = True,
        on_step: Callable[[SchedulerStats], None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids); results come back in order.

        `on_step`, when given, receives every engine step's `SchedulerStats` as the step
        ends (benchmarks integrate KV use and waste over steps with it).
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or self.engine.default_sampling_params()
        params_list = (
            [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        )
        if len(params_list) != len(prompts):
            raise InvalidRequestError(
                "sampling_params", f"{len(params_list)} given for {len(prompts)} prompts"
            )
        results: dict[str, RequestOutput] = {}
        order = []
        for i, (prompt, p) in enumerate(zip(prompts, params_list)):
            request_id = f"offline-{next(self._ids)}"
            token_ids = self._to_token_ids(prompt)
            self.engine.add_request(
                request_id, token_ids, p, priority=priority[i] if priority else 0
            )
            results[request_id] = RequestOutput(
                request_id,
                token_ids,
                [
                    CompletionOutput(index=j, logprobs=[] if p.logprobs is not None else None)
                    for j in range(p.n)
                ],
                prompt=prompt if isinstance(prompt, str) else None,
            )
            order.append(request_id)
        while self.engine.has_unfinished_requests():
            step = self.engine.step()
            self.last_stats = step.stats
            if on_step is not None:
                on_step(step.stats)
            for delta in step.deltas:
                _apply_delta(results[delta.request_id], delta)
        if detokenize and self._can_detokenize():
            tokenizer = self.get_tokenizer()
            for result in results.values():
                for completion in result.outputs:
                    completion.text = tokenizer.decode(
                        completion.token_ids, skip_special_tokens=True
                    )
        return [results[r] for r in order]

    def _can_detokenize(self) -> bool:
        try:
            self.get_tokenizer()
        except InvalidRequestError:
            return False
        return True


def _apply_delta(result: RequestOutput, delta: RequestDelta) -> None:
    completion = result.outputs[delta.index]
    completion.token_ids.extend(delta.new_token_ids)
    if delta.new_logprobs and completion.logprobs is not None:
        completion.logprobs.extend(delta.new_logprobs)
    if delta.prompt_logprobs is not None and delta.index == 0:
        if result.prompt_logprobs is None:
            result.prompt_logprobs = [None]  # the first prompt token has no logprob
        result.prompt_logprobs.extend(delta.prompt_logprobs)
    result.num_cached_tokens = delta.num_cached_tokens
    if delta.finished:
        completion.finish_reason = delta.finish_reason
        completion.stop_reason = delta.stop_reason
