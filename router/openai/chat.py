"""POST /v1/chat/completions: a conversation through the model's chat template."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from router.errors import UnsupportedFieldError
from router.generation import Generation
from router.openai.protocol import ChatCompletionRequest, TextPart
from router.openai.request_log import new_request_id
from router.openai.responses import (
    Envelope,
    LogprobFormat,
    chat_logprobs,
    collect,
    prompt_logprobs,
)
from router.openai.sampling import check_supported, request_message
from router.sampling import plan_sampling
from router.state import RouterState
from shared.errors import InvalidRequestError
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb

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
            # Clients echo earlier answers back whole: empty fields say nothing.
            if value in (None, [], ""):
                continue
            if key in _TOOL_KEYS:
                raise UnsupportedFieldError(f"{where}.{key}")
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


class ChatCompletion:
    """One /v1/chat/completions request: its generation and how its choices are written."""

    def __init__(
        self,
        state: RouterState,
        request: ChatCompletionRequest,
        generation: Generation,
        echo: str = "",
    ) -> None:
        self.model = state.model_for(request.model)
        self.request = request
        self.generation = generation
        self.echo = echo  # prepended to every choice's content (vLLM's echo)
        self.logprob_format = LogprobFormat(
            self.model.tokenizer,
            request.return_tokens_as_token_ids,
            # OpenAI: top_logprobs 0 lists no alternatives at all.
            top_with_sampled=bool(request.top_logprobs),
        )
        self.include_usage = (
            request.stream_options is not None and request.stream_options.include_usage
        )

    @classmethod
    async def start(
        cls, state: RouterState, request: ChatCompletionRequest, arrival: float
    ) -> ChatCompletion:
        """Validate, render the conversation with the chat template, start it on a worker."""
        model = state.model_for(request.model)
        check_supported(request)
        if request.top_logprobs is not None and not request.logprobs:
            raise InvalidRequestError("top_logprobs", "needs logprobs set to true")
        limit = model.limits.max_logprobs
        if request.top_logprobs is not None and not 0 <= request.top_logprobs <= limit:
            raise InvalidRequestError(
                "top_logprobs", f"must be in [0, {limit}], got {request.top_logprobs}"
            )
        messages = template_messages(request)
        _, prompt = await model.render_chat(
            messages, request.add_generation_prompt, request.add_special_tokens
        )
        max_tokens = request.max_completion_tokens
        max_tokens = request.max_tokens if max_tokens is None else max_tokens
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
        message = request_message(request, max_tokens, logprobs, request.prompt_logprobs)
        plan = await plan_sampling(model, message, [prompt], "messages")
        generation = Generation(
            model, state.dispatcher, state.metrics, new_request_id("chatcmpl"), plan.prompts,
            plan.params, plan.text, request.cache_salt, arrival, request.priority,
        )  # fmt: skip
        await generation.start()
        return cls(state, request, generation, _echo(request, messages))

    def _logprobs(self, entries: list[wpb.TokenLogprob]) -> dict[str, Any] | None:
        return chat_logprobs(self.logprob_format, entries) if self.request.logprobs else None

    def _prompt_logprobs(self) -> dict[str, Any]:
        if self.request.prompt_logprobs is None:
            return {}
        entries = self.generation.prompt_logprobs[0]
        return {"prompt_logprobs": prompt_logprobs(self.logprob_format, entries)}

    async def whole(self) -> dict[str, Any]:
        choices = [
            {
                "index": result.index,
                "message": {
                    "role": "assistant",
                    "content": self.echo + result.text,
                    "refusal": None,
                },
                "logprobs": self._logprobs(result.logprobs),
                "finish_reason": result.finish_reason,
                "stop_reason": result.stop_reason,
            }
            for result in await collect(self.generation)
        ]
        body = Envelope(self.generation, self.model.name, "chat.completion").whole(choices)
        return {**body, **self._prompt_logprobs()}

    async def events(self) -> AsyncIterator[bytes]:
        """Per choice: a role chunk, content chunks, a finish chunk; then the usage chunk
        (when asked for) and [DONE], as OpenAI streams them."""
        envelope = Envelope(
            self.generation, self.model.name, "chat.completion.chunk", self.include_usage
        )

        def chunk(index: int, delta: dict[str, Any], **extra: Any) -> bytes:
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
            return envelope.chunk({**choice, **extra})

        for index in range(self.generation.n):
            yield chunk(index, {"role": "assistant", "content": self.echo})
        async for delta in self.generation.deltas():
            if delta.text or (self.request.logprobs and delta.token_ids):
                logprobs = self._logprobs(delta.logprobs)
                yield chunk(delta.index, {"content": delta.text}, logprobs=logprobs)
            if delta.finish_reason is not None:
                yield chunk(
                    delta.index,
                    {},
                    finish_reason=delta.finish_reason,
                    stop_reason=delta.stop_reason,
                )
        for event in envelope.end():
            yield event


def _echo(request: ChatCompletionRequest, messages: list[dict[str, Any]]) -> str:
    """vLLM's chat echo: the last message's content, when the answer continues it (the
    answer's role is "assistant", or the last message's own without a generation prompt)."""
    if not request.echo:
        return ""
    role = "assistant" if request.add_generation_prompt else request.messages[-1].role
    last = messages[-1]
    return last["content"] if request.messages[-1].role == role else ""
