"""POST /v1/completions: prompts as text or token ids, streamed or whole."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from router.generation import Generation
from router.model import ModelContext
from router.openai.protocol import CompletionRequest
from router.openai.request_log import new_request_id
from router.openai.responses import (
    Envelope,
    LogprobFormat,
    collect,
    completion_logprobs,
    prompt_logprobs,
)
from router.openai.sampling import check_supported, request_message
from router.sampling import plan_sampling
from router.state import RouterState
from shared.errors import InvalidRequestError
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb

MAX_PROMPTS = 256


async def prompt_token_ids(
    model: ModelContext, prompt: Any, add_special_tokens: bool = True
) -> tuple[list[list[int]], list[str | None]]:
    """Every prompt as token ids, and as text where it came as text (for echo)."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise InvalidRequestError("prompt", "must not be empty")
    if all(isinstance(p, int) for p in prompt):
        prompt = [prompt]
    if len(prompt) > MAX_PROMPTS:
        raise InvalidRequestError("prompt", f"at most {MAX_PROMPTS} prompts, got {len(prompt)}")
    ids: list[list[int]] = []
    texts: list[str | None] = []
    for item in prompt:
        if isinstance(item, str):
            ids.append(await model.encode(item, add_special_tokens))
            texts.append(item)
        else:
            ids.append(list(item))
            texts.append(None)
    return ids, texts


class Completion:
    """One /v1/completions request: its generation and how its choices are written."""

    def __init__(
        self,
        state: RouterState,
        request: CompletionRequest,
        generation: Generation,
        echoes: list[str],
    ) -> None:
        self.model = state.model_for(request.model)
        self.request = request
        self.generation = generation
        self.echoes = echoes  # per prompt, when echo is set
        self.logprob_format = LogprobFormat(
            self.model.tokenizer, request.return_tokens_as_token_ids
        )
        include_usage = request.stream_options is not None and request.stream_options.include_usage
        self.envelope = Envelope(generation, self.model.name, "text_completion", include_usage)

    @classmethod
    async def start(
        cls, state: RouterState, request: CompletionRequest, arrival: float
    ) -> Completion:
        """Validate, tokenize, and start every prompt on a worker."""
        model = state.model_for(request.model)
        check_supported(request)
        prompts, texts = await prompt_token_ids(model, request.prompt, request.add_special_tokens)
        logprobs = request.logprobs
        # echo with logprobs shows the prompt's logprobs too.
        wanted = request.prompt_logprobs
        if wanted is None and request.echo and logprobs is not None:
            wanted = logprobs
        message = request_message(request, request.max_tokens, logprobs, wanted)
        plan = await plan_sampling(model, message, prompts, "prompt")
        generation = Generation(
            model, state.dispatcher, state.metrics, new_request_id("cmpl"), plan.prompts,
            plan.params, plan.text, request.cache_salt, arrival, request.priority,
        )  # fmt: skip
        await generation.start()
        echoes = []
        if request.echo:
            # A prompt given as text echoes as given, unless truncate_prompt_tokens cut it.
            echoes = [
                t
                if t is not None and len(p) == len(original)
                else model.tokenizer.decode(p, request.skip_special_tokens)
                for t, p, original in zip(texts, plan.prompts, prompts)
            ]
        return cls(state, request, generation, echoes)

    def choice_text(
        self,
        index: int,
        text: str,
        token_ids: Sequence[int],
        logprobs: Sequence[wpb.TokenLogprob],
        is_first: bool,
    ) -> tuple[str, dict[str, Any] | None]:
        """A choice's text and logprobs, with the prompt in front on its first piece
        when echo is set."""
        entries = None
        if self.request.logprobs is not None:
            entries = completion_logprobs(self.logprob_format, token_ids, logprobs)
        if not (self.echoes and is_first):
            return text, entries
        prompt_index = index // self.generation.n
        text = self.echoes[prompt_index] + text
        if entries is not None:
            prompt = self.generation.prompts[prompt_index]
            prompt_entries = [None, *self.generation.prompt_logprobs[prompt_index]]
            echoed = completion_logprobs(self.logprob_format, prompt, prompt_entries)
            entries = _concat_logprobs(echoed, entries)
        return text, entries

    def prompt_logprobs(self, index: int) -> dict[str, Any]:
        """vLLM's `prompt_logprobs` field of a choice, when asked for."""
        if self.request.prompt_logprobs is None:
            return {}
        entries = self.generation.prompt_logprobs[index // self.generation.n]
        return {"prompt_logprobs": prompt_logprobs(self.logprob_format, entries)}

    async def whole(self) -> dict[str, Any]:
        choices = []
        for result in await collect(self.generation):
            text, logprobs = self.choice_text(
                result.index, result.text, result.token_ids, result.logprobs, is_first=True
            )
            choices.append(
                {
                    "index": result.index,
                    "text": text,
                    "logprobs": logprobs,
                    "finish_reason": result.finish_reason,
                    "stop_reason": result.stop_reason,
                    **self.prompt_logprobs(result.index),
                }
            )
        return self.envelope.whole(choices)

    async def events(self) -> AsyncIterator[bytes]:
        started: set[int] = set()
        async for delta in self.generation.deltas():
            is_first = delta.index not in started
            started.add(delta.index)
            text, logprobs = self.choice_text(
                delta.index, delta.text, delta.token_ids, delta.logprobs, is_first
            )
            if text or (delta.token_ids and logprobs is not None):
                choice = {"index": delta.index, "text": text, "logprobs": logprobs}
                if is_first:
                    choice.update(self.prompt_logprobs(delta.index))
                yield self.envelope.chunk({**choice, "finish_reason": None})
            if delta.finish_reason is not None:
                yield self.envelope.chunk(
                    {
                        "index": delta.index,
                        "text": "",
                        "logprobs": None,
                        "finish_reason": delta.finish_reason,
                        "stop_reason": delta.stop_reason,
                    }
                )
        for event in self.envelope.end():
            yield event


def _concat_logprobs(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    offset = sum(len(t) for t in first["tokens"])
    merged = {key: first[key] + second[key] for key in ("tokens", "token_logprobs", "top_logprobs")}
    merged["text_offset"] = first["text_offset"] + [o + offset for o in second["text_offset"]]
    return merged
