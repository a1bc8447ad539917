"""POST /v1/completions: prompts as text or token ids, streamed or whole."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from router.generation import Generation
from router.model import ModelContext
from router.openai.protocol import CompletionRequest
from router.openai.responses import (
    SSE_DONE,
    collect,
    completion_logprobs,
    sse,
    usage_dict,
)
from router.openai.sampling import check_supported, sampling_params, text_options
from router.state import RouterState
from shared.errors import InvalidRequestError

MAX_PROMPTS = 256


async def prompt_token_ids(
    model: ModelContext, prompt: Any
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
            ids.append(await model.encode(item))
            texts.append(item)
        else:
            ids.append(list(item))
            texts.append(None)
    return ids, texts


async def start_completion(
    state: RouterState, request: CompletionRequest, arrival: float
) -> tuple[Generation, list[str]]:
    """Validate, tokenize and start; returns the generation and each prompt's echo text."""
    model = state.model_for(request.model)
    check_supported(request)
    prompts, texts = await prompt_token_ids(model, request.prompt)
    text = text_options(request)
    logprobs = request.logprobs
    prompt_logprobs = logprobs if request.echo and logprobs is not None else None
    params = [
        sampling_params(
            request,
            model,
            model.check_prompt(p, request.max_tokens, "prompt"),
            logprobs,
            prompt_logprobs,
        )
        for p in prompts
    ]
    generation = state.generation(
        model, f"cmpl-{uuid.uuid4().hex}", prompts, params, text, request.cache_salt, arrival
    )
    await generation.start()
    echoes = []
    if request.echo:
        echoes = [
            t if t is not None else model.tokenizer.decode(p, request.skip_special_tokens)
            for t, p in zip(texts, prompts)
        ]
    return generation, echoes


def _echo_logprobs(
    model: ModelContext, generation: Generation, prompt_index: int
) -> dict[str, Any]:
    prompt = generation.prompts[prompt_index]
    entries = [None, *generation.prompt_logprobs[prompt_index]]
    return completion_logprobs(model.tokenizer, prompt, entries)


def _merge_logprobs(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    offset = sum(len(t) for t in first["tokens"])
    merged = {key: first[key] + second[key] for key in ("tokens", "token_logprobs", "top_logprobs")}
    merged["text_offset"] = first["text_offset"] + [o + offset for o in second["text_offset"]]
    return merged


async def completion_response(
    state: RouterState, request: CompletionRequest, generation: Generation, echoes: list[str]
) -> dict[str, Any]:
    model = state.model_for(request.model)
    results = await collect(generation)
    choices = []
    for result in results:
        prompt_index = result.index // generation.n
        text, logprobs = result.text, None
        if request.logprobs is not None:
            logprobs = completion_logprobs(model.tokenizer, result.token_ids, result.logprobs)
        if echoes:
            text = echoes[prompt_index] + text
            if logprobs is not None:
                logprobs = _merge_logprobs(
                    _echo_logprobs(model, generation, prompt_index), logprobs
                )
        choices.append(
            {
                "index": result.index,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": result.finish_reason,
                "stop_reason": result.stop_reason,
            }
        )
    return {
        "id": generation.request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model.name,
        "choices": choices,
        "usage": usage_dict(generation.usage),
    }


async def completion_events(
    state: RouterState, request: CompletionRequest, generation: Generation, echoes: list[str]
) -> AsyncIterator[bytes]:
    model = state.model_for(request.model)
    include_usage = request.stream_options is not None and request.stream_options.include_usage
    created = int(time.time())
    echoed: set[int] = set()

    def chunk(choice: dict[str, Any]) -> bytes:
        body: dict[str, Any] = {
            "id": generation.request_id,
            "object": "text_completion",
            "created": created,
            "model": model.name,
            "choices": [choice],
        }
        if include_usage:
            body["usage"] = None
        return sse(body)

    async for delta in generation.deltas():
        prompt_index = delta.index // generation.n
        text, logprobs = delta.text, None
        if request.logprobs is not None:
            logprobs = completion_logprobs(model.tokenizer, delta.token_ids, delta.logprobs)
        if echoes and delta.index not in echoed:
            echoed.add(delta.index)
            text = echoes[prompt_index] + text
            if logprobs is not None:
                logprobs = _merge_logprobs(
                    _echo_logprobs(model, generation, prompt_index), logprobs
                )
        if text or (delta.token_ids and logprobs is not None):
            choice = {
                "index": delta.index,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": None,
            }
            yield chunk(choice)
        if delta.finish_reason is not None:
            yield chunk(
                {
                    "index": delta.index,
                    "text": "",
                    "logprobs": None,
                    "finish_reason": delta.finish_reason,
                    "stop_reason": delta.stop_reason,
                }
            )
    if include_usage:
        yield sse(
            {
                "id": generation.request_id,
                "object": "text_completion",
                "created": created,
                "model": model.name,
                "choices": [],
                "usage": usage_dict(generation.usage),
            }
        )
    yield SSE_DONE
