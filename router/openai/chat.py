"""POST /v1/chat/completions: a conversation through the model's chat template."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from router.errors import UnsupportedFieldError
from router.generation import Generation
from router.openai.chat_message import MessageParser, MessageStream, finish_reason, whole_message
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
from router.text.reasoning import get_reasoning_parser
from router.tools.parsers import NamedCallParser, RequiredCallsParser, ToolParser, get_tool_parser
from router.tools.tool_choice import ToolChoice, template_tool_calls, tool_choice
from shared.errors import InvalidRequestError
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb

ROLES = ("system", "user", "assistant", "developer", "tool")
# Message keys of the deprecated function-calling API, which Pagoda does not implement.
_FUNCTION_KEYS = ("function_call",)
# Keys of an earlier answer that clients send back and that templates do not read.
_IGNORED_KEYS = ("refusal", "annotations", "audio", "reasoning_content", "reasoning")


def template_messages(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: role and plain-text content, tool calls
    of earlier answers (arguments as objects) and tool results with their call id."""
    messages = []
    for i, message in enumerate(request.messages):
        where = f"messages.{i}"
        if message.role == "function":
            raise UnsupportedFieldError(f"{where}.role")
        if message.role not in ROLES:
            raise InvalidRequestError(
                f"{where}.role", f"must be one of {', '.join(ROLES)}, got {message.role!r}"
            )
        extra: dict[str, Any] = {}
        for key, value in (message.model_extra or {}).items():
            # Clients echo earlier answers back whole: empty fields say nothing.
            if value in (None, [], "") or key in _IGNORED_KEYS:
                continue
            if key in _FUNCTION_KEYS:
                raise UnsupportedFieldError(f"{where}.{key}")
            if key == "tool_calls" and message.role == "assistant":
                extra["tool_calls"] = template_tool_calls(value, f"{where}.tool_calls")
            elif key == "tool_call_id" and message.role == "tool":
                extra["tool_call_id"] = str(value)
            else:
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
        entry: dict[str, Any] = {"role": role, "content": content or "", **extra}
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
        parser: MessageParser | None = None,
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
        self.parser = parser or MessageParser()

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
        config = state.config
        choice = tool_choice(
            request.tools, request.tool_choice, request.parallel_tool_calls,
            config.enable_auto_tool_choice,
        )  # fmt: skip
        template_kwargs = request.chat_template_kwargs or {}
        reserved = next((k for k in ("messages", "tools", "add_generation_prompt")
                         if k in template_kwargs), None)  # fmt: skip
        if reserved is not None:
            raise InvalidRequestError(
                f"chat_template_kwargs.{reserved}", "is set by the request itself"
            )
        messages = template_messages(request)
        _, prompt = await model.render_chat(
            messages, request.add_generation_prompt, request.add_special_tokens,
            choice.template_tools, template_kwargs,
        )  # fmt: skip
        max_tokens = request.max_completion_tokens
        max_tokens = request.max_tokens if max_tokens is None else max_tokens
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
        message = request_message(
            request, max_tokens, logprobs, request.prompt_logprobs, choice.constraint()
        )
        parser = MessageParser(
            get_reasoning_parser(config.reasoning_parser) if config.reasoning_parser else None,
            _tool_parser(choice, config.tool_call_parser),
        )
        if parser.tools is not None and parser.tools.needs_special_tokens:
            message.skip_special_tokens = False  # the call markers are special tokens
        plan = await plan_sampling(model, message, [prompt], "messages")
        generation = Generation(
            model, state.dispatcher, state.metrics, new_request_id("chatcmpl"), plan.prompts,
            plan.params, plan.text, request.cache_salt, arrival, request.priority,
        )  # fmt: skip
        await generation.start()
        return cls(state, request, generation, _echo(request, messages), parser)

    def _logprobs(self, entries: list[wpb.TokenLogprob]) -> dict[str, Any] | None:
        return chat_logprobs(self.logprob_format, entries) if self.request.logprobs else None

    def _prompt_logprobs(self) -> dict[str, Any]:
        if self.request.prompt_logprobs is None:
            return {}
        entries = self.generation.prompt_logprobs[0]
        return {"prompt_logprobs": prompt_logprobs(self.logprob_format, entries)}

    def _message(self, text: str) -> dict[str, Any]:
        if self.parser.is_plain:
            return {"role": "assistant", "content": self.echo + text, "refusal": None}
        return {"role": "assistant", **whole_message(self.parser, text), "refusal": None}

    async def whole(self) -> dict[str, Any]:
        choices = []
        for result in await collect(self.generation):
            message = self._message(result.text)
            reason = finish_reason(result.finish_reason, bool(message.get("tool_calls")))
            choices.append(
                {
                    "index": result.index,
                    "message": message,
                    "logprobs": self._logprobs(result.logprobs),
                    "finish_reason": reason,
                    "stop_reason": result.stop_reason,
                }
            )
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

        num_choices = len(self.generation.prompts) * self.generation.n
        streams = [MessageStream(self.parser) for _ in range(num_choices)]
        for index in range(num_choices):
            yield chunk(index, {"role": "assistant", "content": self.echo})
        async for delta in self.generation.deltas():
            stream = streams[delta.index]
            if self.parser.is_plain:
                if delta.text or (self.request.logprobs and delta.token_ids):
                    logprobs = self._logprobs(delta.logprobs)
                    yield chunk(delta.index, {"content": delta.text}, logprobs=logprobs)
            else:
                parts = stream.feed(delta.text)
                if delta.finish_reason is not None:
                    parts += stream.finish()
                logprobs = self._logprobs(delta.logprobs) if delta.token_ids else None
                for part in parts or ([{}] if logprobs else []):
                    yield chunk(delta.index, part, logprobs=logprobs)
                    logprobs = None  # once per worker delta
            if delta.finish_reason is not None:
                yield chunk(
                    delta.index,
                    {},
                    finish_reason=finish_reason(delta.finish_reason, stream.has_calls),
                    stop_reason=delta.stop_reason,
                )
        for event in envelope.end():
            yield event


def _tool_parser(choice: ToolChoice, auto_parser: str | None) -> ToolParser | None:
    if choice.mode == "named":
        return NamedCallParser(choice.named)
    if choice.mode == "required":
        return RequiredCallsParser()
    if choice.mode == "auto":
        return get_tool_parser(auto_parser)
    return None


def _echo(request: ChatCompletionRequest, messages: list[dict[str, Any]]) -> str:
    """vLLM's chat echo: the last message's content, when the answer continues it (the
    answer's role is "assistant", or the last message's own without a generation prompt)."""
    if not request.echo:
        return ""
    role = "assistant" if request.add_generation_prompt else request.messages[-1].role
    last = messages[-1]
    return last["content"] if request.messages[-1].role == role else ""
