"""Every HTTP request's id and its access log line, as ASGI middleware.

The id is the client's `X-Request-Id` header when it sends one (else a fresh
one); completions and chat build their response ids from it (`cmpl-<id>`,
`chatcmpl-<id>`), as vLLM does, so a client can find its request in the logs
and on the workers. With `--enable-request-id-headers` the answer carries the
id back in the same header. One line per request goes to the log when the
answer has been sent in full (a stream: at its end), unless
`--disable-log-requests`:

```
POST /v1/completions 200 1.234s request_id=3f2a... worker=host-50051
```

Plain ASGI rather than Starlette's BaseHTTPMiddleware, which runs the app in a
task of its own and wraps `receive`: the routes listen on `receive` for the
client's disconnect, and a stream must not be buffered.
"""

from __future__ import annotations

import time
import uuid
from contextvars import ContextVar
from typing import Any

from shared.logging import get_logger

logger = get_logger("router.access")

REQUEST_ID_HEADER = b"x-request-id"
_WORKER_HEADER = b"x-pagoda-worker"
_request_id: ContextVar[str | None] = ContextVar("request_id", default=None)


def new_request_id(prefix: str) -> str:
    """`prefix-<the HTTP request's id>`; a fresh id outside an HTTP request."""
    return f"{prefix}-{_request_id.get() or uuid.uuid4().hex}"


class RequestLog:
    def __init__(self, app: Any, echo_request_id: bool, log_requests: bool) -> None:
        self.app = app
        self.echo_request_id = echo_request_id
        self.log_requests = log_requests

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        given = headers.get(REQUEST_ID_HEADER, b"").decode("latin-1").strip()
        request_id = given or uuid.uuid4().hex
        started = time.monotonic()
        answer: dict[str, Any] = {"status": 0, "worker": ""}

        async def send_with_id(message: dict) -> None:
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
                answer["worker"] = dict(message.get("headers") or ()).get(_WORKER_HEADER, b"")
                if self.echo_request_id:
                    message = dict(message)
                    message["headers"] = [
                        *message.get("headers", ()),
                        (REQUEST_ID_HEADER, request_id.encode("latin-1")),
                    ]
            await send(message)

        token = _request_id.set(request_id)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            _request_id.reset(token)
            if self.log_requests:
                worker = answer["worker"].decode("latin-1")
                logger.info(
                    "%s %s %d %.3fs request_id=%s%s",
                    scope.get("method", ""),
                    scope.get("path", ""),
                    answer["status"],
                    time.monotonic() - started,
                    request_id,
                    f" worker={worker}" if worker else "",
                )
