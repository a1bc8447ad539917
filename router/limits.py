"""What one request may ask of the router and its workers, checked before the work starts.

Each bound is a flag (router/config.py) and each breach a 4xx naming the flag:
a body too large is refused before it is parsed, a prompt too long before it is
tokenized (tokenizing 10 MB of text takes seconds that a request which can never
fit should not get; a chat's text is counted before its template runs, and the
rendered prompt again before tokenizing, since tool calls, tool definitions and
names reach the prompt too), a chat with more than `--max-chat-messages`
messages before its template runs, and a request that would have the workers generate more
than `--max-tokens-per-request` tokens (n x max_tokens over its prompts) before
any worker is asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from router.config import DEFAULT_MAX_CHAT_MESSAGES
from router.errors import ContextLengthError
from shared.errors import InvalidRequestError, PagodaError


class BodyTooLargeError(PagodaError):
    grpc_code = "INVALID_ARGUMENT"
    http_status = 413
    code = "request_too_large"


class UnsupportedMediaTypeError(PagodaError):
    grpc_code = "INVALID_ARGUMENT"
    http_status = 415
    code = "unsupported_media_type"


@dataclass(frozen=True)
class RequestLimits:
    max_model_len: int
    max_prompt_chars: int
    max_tokens_per_request: int
    max_chat_messages: int = DEFAULT_MAX_CHAT_MESSAGES

    @classmethod
    def for_model(
        cls,
        max_model_len: int,
        longest_token_chars: int,
        max_prompt_chars: int | None,
        max_tokens_per_request: int,
        max_chat_messages: int = DEFAULT_MAX_CHAT_MESSAGES,
    ) -> RequestLimits:
        # NOTE: every token stands for at most `longest_token_chars` characters, so
        # text longer than max_model_len times that cannot tokenize into the context.
        chars = max_prompt_chars or max_model_len * max(longest_token_chars, 1)
        return cls(max_model_len, chars, max_tokens_per_request, max_chat_messages)

    def check_messages(self, num_messages: int) -> None:
        """Before the chat template runs: its time grows with the messages, even empty
        ones, and a 32 MB body holds a million of those."""
        if num_messages > self.max_chat_messages:
            raise InvalidRequestError(
                "messages",
                f"at most {self.max_chat_messages} messages per request "
                f"(--max-chat-messages), got {num_messages}",
            )

    def check_prompt_chars(self, num_chars: int, what: str) -> None:
        if num_chars > self.max_prompt_chars:
            raise ContextLengthError(
                what,
                f"{num_chars} characters cannot fit in this model's maximum context length "
                f"of {self.max_model_len} tokens (at most {self.max_prompt_chars} are accepted "
                f"before tokenizing, --max-prompt-chars); shorten it",
            )

    def check_tokens(self, n: int, max_tokens: list[int]) -> None:
        total = n * sum(max_tokens)
        if total > self.max_tokens_per_request:
            raise InvalidRequestError(
                "max_tokens",
                f"n ({n}) x max_tokens ({'+'.join(map(str, max_tokens))}) asks for {total} "
                f"tokens, more than one request may generate here ({self.max_tokens_per_request},"
                f" --max-tokens-per-request); lower n or max_tokens",
            )


def check_body(content_type: str | None, content_length: int, max_bytes: int) -> None:
    """Refuse a body that is not JSON (when it says what it is) or is too large."""
    if content_type:
        media = content_type.split(";", 1)[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            raise UnsupportedMediaTypeError(
                f"the body is {media!r}; send JSON with 'Content-Type: application/json'"
            )
    if content_length > max_bytes:
        raise BodyTooLargeError(
            f"the body has {content_length} bytes, more than this server accepts "
            f"({max_bytes}, --max-request-body-bytes)"
        )


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request's body, refused as soon as it is known to be too large (by its
    Content-Length, or while it arrives when it has none) or not JSON. It is kept
    on the request, where Request.body() finds it."""
    try:
        declared = int(request.headers.get("content-length") or 0)
    except ValueError:
        declared = 0
    check_body(request.headers.get("content-type"), declared, max_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        check_body(None, size, max_bytes)
        chunks.append(chunk)
    body = request._body = b"".join(chunks)
    return body
