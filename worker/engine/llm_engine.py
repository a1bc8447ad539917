"""The engine's front door: validates requests, fans out `n`, names outputs.

Both the offline `LLM` and the worker service drive the engine through this
class. Outside it, a request is its id plus a sample index; inside, each of
the `n` samples is its own engine request sharing the prompt's blocks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from shared.errors import ConfigError, InvalidRequestError
from shared.sampling_params import SamplingParams
from worker.config import EngineConfig
from worker.engine.engine_core import EngineCore, EngineStepOutput
from worker.models.generation_config import load_sampling_defaults
from worker.request import Request
from worker.structured.compiler import GrammarCompiler


class LLMEngine:
    def __init__(
        self, config: EngineConfig, record_kv_events: bool = False, offline: bool = False
    ) -> None:
        """offline: the default step budget is the offline one (worker/config.py)."""
        self.core = EngineCore(config, record_kv_events=record_kv_events, offline=offline)
        self.config = self.core.config
        self.spec = self.core.spec
        self.max_model_len = self.core.max_model_len
        # SamplingParams fields the model recommends (--generation-config).
        self.sampling_defaults = load_sampling_defaults(
            self.spec.path, self.config.model.generation_config
        )
        try:
            self.default_sampling_params()
        except InvalidRequestError as exc:
            raise ConfigError(
                f"the model's generation_config.json recommends an invalid value ({exc}); "
                "start with --generation-config vllm to ignore it"
            ) from None
        # Compiles structured_outputs constraints (worker/structured/), in its own threads.
        self.grammars = GrammarCompiler(
            self.config.model.tokenizer or self.spec.path, self.vocab_size, self.spec.eos_token_ids
        )
        self._children: dict[str, list[str]] = {}
        self._parent_of: dict[str, tuple[str, int]] = {}

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    def default_sampling_params(self) -> SamplingParams:
        """What a request that sets nothing gets: the model's recommendations over the
        engine defaults (vLLM's `LLM.get_default_sampling_params`)."""
        return SamplingParams(**self.sampling_defaults)

    def validate(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        priority: int = 0,
        output_token_ids: Sequence[int] = (),
    ) -> int:
        """Check a request against this model; return its effective max_tokens.
        output_token_ids: what a failed worker generated already (a resumed request)."""
        if priority != 0 and self.config.scheduler.scheduling_policy != "priority":
            # As vLLM: a priority that could not change anything is an error, not ignored.
            raise InvalidRequestError(
                "priority",
                f"is {priority}, but this engine schedules first come, first served; start it "
                "with --scheduling-policy priority to use priorities",
            )
        if len(prompt_token_ids) == 0:
            raise InvalidRequestError("prompt", "must contain at least one token")
        vocab = self.vocab_size
        for i, token in enumerate(prompt_token_ids):
            if not 0 <= token < vocab:
                raise InvalidRequestError(
                    "prompt",
                    f"token id {token} at position {i} is outside the vocabulary [0, {vocab})",
                )
        params.validate_token_ids(vocab)
        most = self.config.model.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            wanted = getattr(params, name)
            if wanted is not None and wanted > most:
                raise InvalidRequestError(
                    name, f"must be in [0, {most}] on this server (--max-logprobs), got {wanted}"
                )
        num_prompt, limit = len(prompt_token_ids), self.max_model_len
        if num_prompt >= limit:
            raise InvalidRequestError(
                "prompt",
                f"{num_prompt} tokens leave no room to generate within the maximum context "
                f"length of {limit} tokens; shorten it to at most {limit - 1}",
            )
        max_tokens = params.max_tokens if params.max_tokens is not None else limit - num_prompt
        if num_prompt + max_tokens > limit:
            raise InvalidRequestError(
                "max_tokens",
                f"the prompt ({num_prompt} tokens) plus max_tokens ({max_tokens}) exceeds the "
                f"maximum context length of {limit} tokens; lower max_tokens to at most "
                f"{limit - num_prompt} or shorten the prompt",
            )
        if params.min_tokens > max_tokens:
            raise InvalidRequestError("min_tokens", f"must be <= max_tokens ({max_tokens})")
        if output_token_ids:
            self._validate_resumed(output_token_ids, params, max_tokens)
        return max_tokens

    def _validate_resumed(
        self, output_token_ids: Sequence[int], params: SamplingParams, max_tokens: int
    ) -> None:
        if params.n != 1:
            raise InvalidRequestError(
                "output_token_ids", f"resumes one sample: n must be 1, got {params.n}"
            )
        if params.prompt_logprobs is not None:
            raise InvalidRequestError(
                "output_token_ids", "a resumed request cannot ask for prompt_logprobs again"
            )
        vocab = self.vocab_size
        bad = next((t for t in output_token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequestError(
                "output_token_ids", f"token id {bad} is outside the vocabulary [0, {vocab})"
            )
        if len(output_token_ids) >= max_tokens:
            raise InvalidRequestError(
                "output_token_ids",
                f"{len(output_token_ids)} tokens already reach max_tokens ({max_tokens}): nothing is left to generate",
            )

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        priority: int = 0,
        cache_salt: bytes | None = None,
        arrival_time: float | None = None,
        grammar: Any = None,
        output_token_ids: Sequence[int] = (),
    ) -> None:
        """grammar: params.structured_outputs compiled (`self.grammars`); compiled here,
        blocking, when not given."""
        if request_id in self._children:
            raise InvalidRequestError("request_id", f"{request_id!r} is already running")
        prompt = [int(t) for t in prompt_token_ids]
        outputs = [int(t) for t in output_token_ids]
        max_tokens = self.validate(prompt, params, priority, outputs)
        if params.structured_outputs is not None and grammar is None:
            grammar = self.grammars.compile(params.structured_outputs)
        cache = self.config.cache
        child_ids = (
            [request_id] if params.n == 1 else [f"{request_id}#{i}" for i in range(params.n)]
        )
        for index, child_id in enumerate(child_ids):
            child_params = params
            if params.n > 1:
                seed = None if params.seed is None else params.seed + index
                child_params = dataclasses.replace(params, n=1, seed=seed)
            request = Request(
                child_id,
                prompt,
                child_params,
                eos_token_ids=self.spec.eos_token_ids,
                max_tokens=max_tokens,
                priority=priority,
                arrival_time=arrival_time,
                block_size=cache.block_size if cache.enable_prefix_caching else None,
                cache_salt=cache_salt,
                grammar=grammar,
                output_token_ids=outputs,
            )
            self._parent_of[child_id] = (request_id, index)
            self.core.add_request(request)
        self._children[request_id] = child_ids

    def abort_request(self, request_id: str) -> None:
        child_ids = self._children.pop(request_id, [])
        self.core.abort_requests(child_ids)
        for child_id in child_ids:
            self._parent_of.pop(child_id, None)

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished_requests()

    def shutdown(self) -> None:
        """Stop the tensor-parallel rank processes, if any; safe to call twice."""
        self.core.shutdown()

    def step(self) -> EngineStepOutput:
        """One engine step; deltas come back under the parent id with their sample index."""
        output = self.core.step()
        parent_of = self._parent_of
        for delta in output.deltas:
            child_id = delta.request_id
            parent_id, index = parent_of[child_id]
            delta.request_id, delta.index = parent_id, index
            if delta.finished:
                del parent_of[child_id]
                children = self._children[parent_id]
                children.remove(child_id)
                if not children:
                    del self._children[parent_id]
        return output
