"""Errors as clients see them: OpenAI-shaped JSON bodies and gRPC statuses.

```
{"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}
```

Statuses come from the error types of shared/errors.py, so every front end
maps the same error the same way.
"""

from __future__ import annotations

from typing import Any

from shared.errors import InvalidRequestError, ModelNotFoundError, PagodaError
from shared.logging import get_logger

logger = get_logger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",  # as OpenAI answers an unknown model
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    503: "service_unavailable_error",
}


class ContextLengthError(InvalidRequestError):
    """The prompt (plus max_tokens) does not fit in the model's context."""

    code = "context_length_exceeded"


class UnsupportedFieldError(InvalidRequestError):
    """A field that would change the output, which Pagoda does not implement (yet)."""

    code = "unsupported_parameter"

    def __init__(self, field: str) -> None:
        super().__init__(
            field, "is not supported by this server; remove it (it would change the output)"
        )


class AuthenticationError(PagodaError):
    grpc_code = "UNAUTHENTICATED"
    http_status = 401
    code = "invalid_api_key"


def error_body(
    message: str, status: int, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "server_error"),
            "param": param,
            "code": code,
        }
    }


def describe(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body) for any exception; unexpected ones are logged as bugs."""
    if not isinstance(exc, PagodaError):
        logger.error("unexpected error answering a request", exc_info=exc)
        return 500, error_body(f"internal error: {type(exc).__name__}: {exc}", 500)
    param = exc.field if isinstance(exc, InvalidRequestError) else None
    code = getattr(exc, "code", None)
    if code is None and isinstance(exc, ModelNotFoundError):
        code = "model_not_found"
    return exc.http_status, error_body(str(exc), exc.http_status, param, code)
