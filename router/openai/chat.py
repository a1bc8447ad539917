"""POST /v1/chat/completions: a conversation through the model's chat template."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from router.errors import UnsupportedFieldError
from router.generation import Generation
from router.openai.protocol import ChatCompletionRequest, TextPart
from router.openai.responses import SSE_DONE, chat_logprobs, collect, sse, usage_dict
from router.openai.sampling import check_supported, sampling_params, text_options
from router.state import RouterState
from shared.errors import InvalidRequestError

ROLES = ("system", "user", "assistant", "developer")
# Keys of a message that belong to tool calling, which Pagoda does not implement.
_TOOL_KEYS = ("tool_calls", "tool_call_id", "function_call")


def template_messages(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: role and plain-text content."""
    messages = []
    for i, message in enumerate(request.messages):
        where = f"messages.{i}"
        if message.role in ("tool", "function"):
            raise UnsupportedFieldError(f"{where}.role")
        if message.role not in ROLES:
            raise InvalidRequestError(
                f"{where}.role", f"must be one of {', '.join(ROLES)}, got {message.role!r}"
            )
        for key, value in (message.model_extra or {}).items():
            if key in _TOOL_KEYS and value:
                raise UnsupportedFieldError(f"{where}.{key}")
            if key not in _TOOL_KEYS and key != "refusal":
                raise InvalidRequestError(f"{where}.{key}", "unrecognized message field")
        content = message.content
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, TextPart):
                    kind = part.get("type") if isinstance(part, dict) else None
                    raise InvalidRequestError(
                        f"{where}.content.{j}",
                        f"only text content parts are supported, got type {kind!r}",
                    )
                texts.append(part.text)
            content = "\n".join(texts)
        # "developer" is OpenAI's newer name for "system"; templates know the latter.
        role = "system" if message.role == "developer" else message.role
        entry: dict[str, Any] = {"role": role, "content": content or ""}
        if message.name is not None:
            entry["name"] = message.name
        messages.append(entry)
    return messages


async def start_chat(
    state: RouterState, request: ChatCompletionRequest, arrival: float
) -> Generation:
    model = state.model_for(request.model)
    check_supported(request)
    if request.top_logprobs is not None and not request.logprobs:
        raise InvalidRequestError("top_logprobs", "needs logprobs set to true")
    _, prompt = await model.render_chat(template_messages(request), request.add_generation_prompt)
    max_tokens = (
        request.max_completion_tokens
        if request.max_completion_tokens is not None
        else request.max_tokens
    )
    max_tokens = model.check_prompt(prompt, max_tokens, "messages")
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    params = sampling_params(request, model, max_tokens, logprobs)
    generation = state.generation(
        model,
        f"chatcmpl-{uuid.uuid4().hex}",
        [prompt],
        [params],
        text_options(request),
        request.cache_salt,
        arrival,
    )
    await generation.start()
    return generation


async def chat_response(
    state: RouterState, request: ChatCompletionRequest, generation: Generation
) -> dict[str, Any]:
    model = state.model_for(request.model)
    choices = []
    for result in await collect(generation):
        choices.append(
            {
                "index": result.index,
                "message": {"role": "assistant", "content": result.text, "refusal": None},
                "logprobs": chat_logprobs(model.tokenizer, result.logprobs)
                if request.logprobs
                else None,
                "finish_reason": result.finish_reason,
                "stop_reason": result.stop_reason,
            }
        )
    return {
        "id": generation.request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model.name,
        "choices": choices,
        "usage": usage_dict(generation.usage),
    }


async def chat_events(
    state: RouterState, request: ChatCompletionRequest, generation: Generation
) -> AsyncIterator[bytes]:
    """Per choice: a role chunk, content chunks, a finish chunk; then the usage chunk
    (when asked for) and [DONE], as OpenAI streams them."""
    model = state.model_for(request.model)
    include_usage = request.stream_options is not None and request.stream_options.include_usage
    created = int(time.time())

    def chunk(index: int, delta: dict[str, Any], **extra: Any) -> bytes:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None, **extra}
        body: dict[str, Any] = {
            "id": generation.request_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model.name,
            "choices": [choice],
        }
        if include_usage:
            body["usage"] = None
        return sse(body)

    for index in range(generation.n):
        yield chunk(index, {"role": "assistant", "content": ""})
    async for delta in generation.deltas():
        if delta.text or (request.logprobs and delta.token_ids):
            logprobs = chat_logprobs(model.tokenizer, delta.logprobs) if request.logprobs else None
            yield chunk(delta.index, {"content": delta.text}, logprobs=logprobs)
        if delta.finish_reason is not None:
            yield chunk(
                delta.index, {}, finish_reason=delta.finish_reason, stop_reason=delta.stop_reason
            )
    if include_usage:
        yield sse(
            {
                "id": generation.request_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model.name,
                "choices": [],
                "usage": usage_dict(generation.usage),
            }
        )
    yield SSE_DONE
