"""OpenAI request bodies (pydantic v2), with the vLLM extras users rely on.

Unknown fields are refused (400 naming them), as OpenAI does. Fields that
exist in the OpenAI API but would change the output in ways Pagoda does not
implement are declared, so that setting them is a 400 saying so, never a
silent 200 that ignores them. Fields that do not change the output
(`user`, `metadata`, `store`, ...) are accepted and ignored.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from shared.errors import InvalidRequestError

B = TypeVar("B", bound=BaseModel)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM; accepted, usage comes at the end


class SamplingFields(_Body):
    """What completions and chat share: OpenAI's sampling fields and vLLM's extras."""

    model: str
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: list[StrictInt] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    cache_salt: str | None = None
    priority: int = 0
    prompt_logprobs: int | None = None
    truncate_prompt_tokens: int | None = None
    allowed_token_ids: list[StrictInt] | None = None
    bad_words: list[str] | None = None
    return_tokens_as_token_ids: bool = False
    stream_interval: int | None = None  # tokens per streamed chunk (the worker holds them)
    # Output constraints (router/openai/structured_outputs.py); at most one.
    response_format: dict[str, Any] | None = None
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    # Declared only to be refused when set (see the module doc).
    best_of: int | None = None
    logits_processors: Any = None
    use_beam_search: bool = False

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(SamplingFields):
    # Strict: JSON's true and 1.0 are not token ids (lax parsing read [[false]] as [[0]]).
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: int | None = 16  # OpenAI's default for completions
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    add_special_tokens: bool = True  # vLLM extra: the tokenizer's BOS and the like


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    # Extra keys of a message (e.g. tool_call_id) are refused one by one below.
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[TextPart | dict[str, Any]] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None  # default: the rest of the context
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True  # vLLM extra
    # vLLM extras: special tokens on top of the template's own; and prepend the last
    # message's content to the answer when it is the answer's own role (continuing it).
    add_special_tokens: bool = False
    echo: bool = False
    # Accepted and ignored: they do not change the output.
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    parallel_tool_calls: bool | None = None
    # Checked: only the values that change nothing are accepted.
    tool_choice: Any = None
    modalities: list[str] | None = None
    # Declared only to be refused when set.
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: str | None = None
    web_search_options: Any = None
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[Any] | None = None


def _location(loc: tuple[int | str, ...]) -> str:
    """`messages.0.content`, without the union member tags pydantic adds (`str`, `list[int]`)."""
    parts = []
    for part in loc:
        if isinstance(part, str) and ("[" in part or part in _TYPE_TAGS):
            break
        parts.append(str(part))
    return ".".join(parts)


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "TextPart"})


def parse_request(cls: type[B], body: bytes) -> B:
    """Parse a JSON body; any problem is a 400 naming the field."""
    try:
        return cls.model_validate_json(body)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        location = _location(error["loc"])
        if error["type"] == "json_invalid":
            raise InvalidRequestError("body", f"not valid JSON: {error['msg']}") from None
        if error["type"] == "extra_forbidden":
            if not location:  # a key such as "" or "a[b]" names no field of its own
                name = error["loc"][-1]
                raise InvalidRequestError(
                    "body", f"unrecognized request argument {name!r}"
                ) from None
            raise InvalidRequestError(location, "unrecognized request argument") from None
        if error["type"] == "missing":
            raise InvalidRequestError(location, "this field is required") from None
        if not location:
            raise InvalidRequestError("body", f"must be a JSON object ({error['msg']})") from None
        raise InvalidRequestError(location, error["msg"]) from None
