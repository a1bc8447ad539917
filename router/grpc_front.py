"""The gRPC text API (protos/pagoda/v1/router.proto) over the same pipeline as HTTP.

The request's SamplingParams message is the one the OpenAI API builds from its
JSON, validated by the same code (router/sampling.py), so both fronts accept
and refuse the same values with the same messages.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, NoReturn

import grpc

from router.errors import describe
from router.generation import Generation
from router.model import ModelContext
from router.sampling import plan_sampling
from router.state import RouterState
from shared.errors import InvalidRequestError, PagodaError
from shared.proto.pagoda.v1 import router_pb2 as pb
from shared.proto.pagoda.v1 import router_pb2_grpc as pb_grpc
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["RouterService"].full_name
MAX_REQUEST_ID_LEN = 256
WORKER_METADATA = "x-pagoda-worker"  # trailing metadata: the workers that served, in order
_FINISH_REASONS = {
    "stop": pb.FINISH_REASON_STOP,
    "length": pb.FINISH_REASON_LENGTH,
    "abort": pb.FINISH_REASON_ABORT,
}


async def abort(
    context: grpc.aio.ServicerContext, exc: BaseException, on_status: Any = None
) -> NoReturn:
    """End the call with the status `exc` means; `on_status(http_status)` counts it."""
    status, body = describe(exc)
    if on_status is not None:
        on_status(status)
    code = (
        grpc.StatusCode[exc.grpc_code] if isinstance(exc, PagodaError) else grpc.StatusCode.INTERNAL
    )
    await context.abort(code, body["error"]["message"])
    raise AssertionError("context.abort returned")  # it always raises


def _logprobs(model: ModelContext, entries: Sequence[wpb.TokenLogprob]) -> list[pb.TokenLogprob]:
    """With their text; the top list holds the token itself too when it is not among
    the most likely (as OpenAI lists them)."""
    text = model.tokenizer.token_text
    result = []
    for e in entries:
        top = [(t.token_id, t.logprob) for t in e.top]
        if top and all(t != e.token_id for t, _ in top):
            top.append((e.token_id, e.logprob))
        result.append(
            pb.TokenLogprob(
                token_id=e.token_id,
                token=text(e.token_id),
                logprob=e.logprob,
                rank=e.rank,
                top=[pb.TopLogprob(token_id=t, token=text(t), logprob=lp) for t, lp in top],
            )
        )
    return result


def _authorization(context: grpc.aio.ServicerContext) -> str | None:
    return dict(context.invocation_metadata() or ()).get("authorization")


class RouterServicer(pb_grpc.RouterServiceServicer):
    def __init__(self, state: RouterState) -> None:
        self._state = state

    async def Complete(
        self, request: pb.CompleteRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.CompletionResponse]:
        async def prompt(model: ModelContext) -> list[int]:
            if request.WhichOneof("prompt") == "token_ids":
                return list(request.token_ids.ids)
            special = request.add_special_tokens if request.HasField("add_special_tokens") else True
            return await model.encode(request.text, special)

        async for response in self._serve("grpc_complete", request, context, prompt, "prompt"):
            yield response

    async def Chat(
        self, request: pb.ChatRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.CompletionResponse]:
        async def prompt(model: ModelContext) -> list[int]:
            if not request.messages:
                raise InvalidRequestError("messages", "must contain at least one message")
            messages = [{"role": m.role, "content": m.content} for m in request.messages]
            add_generation_prompt = (
                request.add_generation_prompt if request.HasField("add_generation_prompt") else True
            )
            special = request.HasField("add_special_tokens") and request.add_special_tokens
            return (await model.render_chat(messages, add_generation_prompt, special))[1]

        async for response in self._serve("grpc_chat", request, context, prompt, "messages"):
            yield response

    async def ListModels(
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListModelsResponse:
        try:
            self._state.check_api_key(_authorization(context))
        except Exception as exc:
            await abort(context, exc)
        model, serving = self._state.model, self._state.pool.serving()
        if model is None or not serving:
            return pb.ListModelsResponse()
        card = pb.ModelCard(
            id=model.name, max_model_len=model.limits.max_model_len, num_workers=len(serving)
        )
        return pb.ListModelsResponse(models=[card])

    async def _serve(
        self,
        api: str,
        request: pb.CompleteRequest | pb.ChatRequest,
        context: grpc.aio.ServicerContext,
        prompt: Callable[[ModelContext], Awaitable[list[int]]],
        what: str,
    ) -> AsyncIterator[pb.CompletionResponse]:
        """Check, tokenize (`prompt`), start on a worker, then stream the deltas."""
        arrival = time.monotonic()
        try:
            self._state.check_api_key(_authorization(context))
            if len(request.request_id) > MAX_REQUEST_ID_LEN:
                raise InvalidRequestError("request_id", f"at most {MAX_REQUEST_ID_LEN} characters")
            model = self._state.model_for(request.model)
            plan = await plan_sampling(model, request.sampling_params, [await prompt(model)], what)
            generation = Generation(
                model, self._state.dispatcher, self._state.metrics,
                request.request_id or f"grpc-{uuid.uuid4().hex}", plan.prompts, plan.params,
                plan.text, request.cache_salt if request.HasField("cache_salt") else None,
                arrival, request.priority,
            )  # fmt: skip
            await generation.start()
        except Exception as exc:
            await abort(context, exc, self._counter(api))
        async for response in self._respond(api, model, generation, context):
            yield response

    async def _respond(
        self,
        api: str,
        model: ModelContext,
        generation: Generation,
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.CompletionResponse]:
        metrics, request_id = self._state.metrics, generation.request_id
        num_prompt_logprobs = 0  # sent so far
        try:
            async for delta in generation.deltas():
                prompt_logprobs = generation.prompt_logprobs[0][num_prompt_logprobs:]
                num_prompt_logprobs += len(prompt_logprobs)
                choice = pb.ChoiceDelta(
                    index=delta.index,
                    text=delta.text,
                    token_ids=delta.token_ids,
                    logprobs=_logprobs(model, delta.logprobs),
                    finish_reason=_FINISH_REASONS.get(delta.finish_reason or "", 0),
                )
                if isinstance(delta.stop_reason, str):
                    choice.stop_string = delta.stop_reason
                elif isinstance(delta.stop_reason, int):
                    choice.stop_token_id = delta.stop_reason
                yield pb.CompletionResponse(
                    request_id=request_id,
                    choices=[choice],
                    prompt_logprobs=_logprobs(model, prompt_logprobs),
                )
            usage = generation.usage
            # As the HTTP header: every worker that served it, failovers included.
            context.set_trailing_metadata(((WORKER_METADATA, ",".join(generation.worker_ids)),))
            yield pb.CompletionResponse(
                request_id=request_id,
                usage=pb.Usage(
                    prompt_tokens=usage.prompt_tokens,
                    completion_tokens=usage.completion_tokens,
                    total_tokens=usage.total_tokens,
                    cached_tokens=usage.cached_tokens,
                ),
            )
        except Exception as exc:
            await abort(context, exc, self._counter(api))
        finally:
            generation.close()
        metrics.requests.labels(api, "200").inc()
        metrics.e2e.observe(time.monotonic() - generation.arrival)

    def _counter(self, api: str) -> Any:
        return lambda status: self._state.metrics.requests.labels(api, str(status)).inc()
