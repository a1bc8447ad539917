"""The HTTP app: OpenAI routes, vLLM's extra routes (/tokenize, /detokenize,
/version, /ping), /health, /metrics, and errors as OpenAI-shaped JSON.

A streamed answer starts (headers, status 200) only once the worker has
returned its first response, so every failure before the first token is a
proper status and body, and a worker failing before it is retried unseen.
The workers that served the request are named, in order, in the `x-pagoda-worker`
header (a stream's headers name the first ones; its finish chunks and usage
chunk carry the full list in a `pagoda_worker` field, as a failover adds to it).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from router.errors import describe, error_body
from router.generation import Generation
from router.limits import read_body
from router.metrics import CONTENT_TYPE
from router.openai.chat import ChatCompletion
from router.openai.completions import Completion
from router.openai.openapi import install_openapi
from router.openai.protocol import ChatCompletionRequest, CompletionRequest, parse_request
from router.openai.request_log import RequestLog
from router.openai.responses import guarded_sse
from router.openai.tokenization import DetokenizeRequest, TokenizeRequest, detokenize, tokenize
from router.routing.worker_stream import WorkerFailedError
from router.state import RouterState
from router.worker_metrics import WorkerMetricsScraper
from shared.logging import get_logger

logger = get_logger(__name__)

WORKER_HEADER = "x-pagoda-worker"
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
T = TypeVar("T")
VERSION = importlib.metadata.version("pagoda")
# A handler's result: a JSON body, or the chunks of an SSE body; and its generation.
Answer = tuple[dict[str, Any] | AsyncIterator[bytes], Generation]


class ClientGone(Exception):
    """The client disconnected before its answer started."""


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (and so its worker calls) if the client goes away.

    NOTE: until a response starts, nothing is sent that could fail, so the
    disconnect has to be listened for: a non-streamed answer, or a stream still
    waiting for its first token, would otherwise run on for nobody. The body
    must have been read already: the listener takes every later ASGI message.
    """
    task = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, listener}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            raise ClientGone
        return task.result()
    finally:
        for pending in (task, listener):
            pending.cancel()
        await asyncio.gather(task, listener, return_exceptions=True)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def build_app(state: RouterState) -> RequestLog:
    app = FastAPI(title="Pagoda", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    metrics = state.metrics
    worker_metrics = WorkerMetricsScraper(state.config.worker_metrics_url)

    def error_response(api: str, exc: BaseException) -> JSONResponse:
        status, body = describe(exc)
        metrics.requests.labels(api, str(status)).inc()
        return JSONResponse(body, status_code=status)

    async def answer(
        api: str, request: Request, handle: Callable[[float], Awaitable[Answer]]
    ) -> Response:
        """Run a handler: a dict is answered as JSON, an iterator of chunks as SSE."""
        arrival = time.monotonic()
        try:
            state.check_api_key(request.headers.get("authorization"))
            # Read (and kept) before listening for a disconnect.
            await read_body(request, state.config.max_request_body_bytes)
            payload, generation = await unless_disconnected(request, handle(arrival))
        except ClientGone:
            metrics.requests.labels(api, "499").inc()
            return Response(status_code=499)
        except Exception as exc:
            return error_response(api, exc)
        headers = {WORKER_HEADER: ",".join(generation.worker_ids)}
        if isinstance(payload, dict):
            metrics.requests.labels(api, "200").inc()
            metrics.e2e.observe(time.monotonic() - arrival)
            return JSONResponse(payload, headers=headers)

        def done(outcome: str) -> None:
            metrics.requests.labels(api, outcome).inc()
            metrics.e2e.observe(time.monotonic() - arrival)

        return StreamingResponse(
            guarded_sse(payload, generation, done),
            media_type="text/event-stream",
            headers={**headers, **_SSE_HEADERS},
        )

    async def whole(start: Callable[[], Awaitable[Completion | ChatCompletion]]) -> Answer:
        """A non-streamed answer: nothing has reached the client yet, so a worker that
        fails mid-generation is retried elsewhere, as one failing before it would be."""
        earlier: list[str] = []
        for attempt in range(state.config.max_attempts):
            started = await start()
            started.generation.earlier_worker_ids = list(earlier)
            try:
                return await started.whole(), started.generation
            except WorkerFailedError as exc:
                if attempt + 1 == state.config.max_attempts:
                    raise
                logger.warning(
                    "request %s: %s; retrying it whole", started.generation.request_id, exc
                )
                metrics.retries.inc()
                earlier = started.generation.worker_ids
            finally:
                started.generation.close()
        raise AssertionError("unreachable")

    def openai_route(
        path: str,
        api: str,
        body_type: type[CompletionRequest] | type[ChatCompletionRequest],
        kind: type[Completion] | type[ChatCompletion],
    ) -> None:
        async def endpoint(request: Request) -> Response:
            async def handle(arrival: float) -> Answer:
                body: Any = parse_request(body_type, await request.body())
                if not body.stream:
                    return await whole(lambda: kind.start(state, body, arrival))
                started = await kind.start(state, body, arrival)
                return started.events(), started.generation

            return await answer(api, request, handle)

        app.post(path)(endpoint)

    openai_route("/v1/completions", "completions", CompletionRequest, Completion)
    openai_route("/v1/chat/completions", "chat", ChatCompletionRequest, ChatCompletion)
    install_openapi(
        app,
        {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest},
    )

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        try:
            state.check_api_key(request.headers.get("authorization"))
        except Exception as exc:
            return error_response("models", exc)
        data = []
        if state.model is not None and state.pool.serving():
            data.append(model_card(state, int(time.time())))
        return JSONResponse({"object": "list", "data": data})

    def tokenizer_route(path: str, api: str, body_type: type, handle: Callable) -> None:
        async def endpoint(request: Request) -> Response:
            try:
                state.check_api_key(request.headers.get("authorization"))
                body = parse_request(body_type, await request.body())
                payload = await handle(state, body)
            except Exception as exc:
                return error_response(api, exc)
            metrics.requests.labels(api, "200").inc()
            return JSONResponse(payload)

        app.post(path)(endpoint)

    tokenizer_route("/tokenize", "tokenize", TokenizeRequest, tokenize)
    tokenizer_route("/detokenize", "detokenize", DetokenizeRequest, detokenize)

    @app.get("/version")
    async def version() -> Response:
        return JSONResponse({"version": VERSION})

    async def ping() -> Response:
        """vLLM's (and SageMaker's) liveness probe: 200 while a worker serves, else 503."""
        return await health()

    app.get("/ping")(ping)
    app.post("/ping")(ping)

    @app.get("/health")
    async def health() -> Response:
        num_serving = len(state.pool.serving())
        if num_serving and state.model is not None:
            return JSONResponse({"status": "ok", "workers_serving": num_serving})
        message = state.model_error or "no worker is serving the model"
        return JSONResponse(error_body(message, 503), status_code=503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        body = metrics.render() + await worker_metrics.render()
        return Response(body, media_type=CONTENT_TYPE)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return JSONResponse(
            error_body(str(exc.detail), exc.status_code), status_code=exc.status_code
        )

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        return JSONResponse(error_body(str(exc), 400), status_code=400)

    return RequestLog(
        app, state.config.enable_request_id_headers, not state.config.disable_log_requests
    )


def model_card(state: RouterState, created: int) -> dict[str, Any]:
    """The served model as vLLM's /v1/models lists it (its ModelCard fields)."""
    model = state.model
    assert model is not None
    return {
        "id": model.name,
        "object": "model",
        "created": created,
        "owned_by": "pagoda",
        "root": model.root,
        "parent": None,
        "max_model_len": model.limits.max_model_len,
        "permission": [
            {
                "id": f"modelperm-{model.name}",
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }
