"""The gRPC text API (protos/pagoda/v1/router.proto) over the same pipeline as HTTP.

Sampling fields go through the same validation as the OpenAI API's (they
become a `SamplingFields` first), so both fronts accept and refuse the same
values with the same messages.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc

from router.errors import describe
from router.generation import Generation
from router.model import ModelContext
from router.openai.protocol import SamplingFields
from router.openai.sampling import sampling_params, text_options
from router.state import RouterState
from router.text.choice_text import TextDelta
from shared.errors import InvalidRequestError, PagodaError
from shared.proto.pagoda.v1 import router_pb2 as pb
from shared.proto.pagoda.v1 import router_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["RouterService"].full_name
MAX_REQUEST_ID_LEN = 256
_FINISH_REASONS = {
    "stop": pb.FINISH_REASON_STOP,
    "length": pb.FINISH_REASON_LENGTH,
    "abort": pb.FINISH_REASON_ABORT,
}
_OPTIONAL = (
    "n", "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "min_tokens", "ignore_eos", "skip_special_tokens",
    "include_stop_str_in_output",
)  # fmt: skip


def sampling_fields(model: str, params: pb.SamplingParams) -> SamplingFields:
    values: dict[str, Any] = {
        name: getattr(params, name) for name in _OPTIONAL if params.HasField(name)
    }
    if params.logit_bias:
        values["logit_bias"] = {str(k): v for k, v in params.logit_bias.items()}
    if params.stop:
        values["stop"] = list(params.stop)
    if params.stop_token_ids:
        values["stop_token_ids"] = list(params.stop_token_ids)
    return SamplingFields(model=model, **values)


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


def _logprobs(model: ModelContext, delta: TextDelta) -> list[pb.TokenLogprob]:
    text = model.tokenizer.token_text
    return [
        pb.TokenLogprob(
            token_id=e.token_id,
            token=text(e.token_id),
            logprob=e.logprob,
            top=[
                pb.TopLogprob(token_id=t.token_id, token=text(t.token_id), logprob=t.logprob)
                for t in e.top
            ],
        )
        for e in delta.logprobs
    ]


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
            return await model.encode(request.text)

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
            return (await model.render_chat(messages, add_generation_prompt))[1]

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
            prompt_ids = await prompt(model)
            params = request.sampling_params
            fields = sampling_fields(request.model, params)
            max_tokens = params.max_tokens if params.HasField("max_tokens") else None
            max_tokens = model.check_prompt(prompt_ids, max_tokens, what)
            logprobs = params.logprobs if params.HasField("logprobs") else None
            generation = Generation(
                model, self._state.dispatcher, self._state.metrics,
                request.request_id or f"grpc-{uuid.uuid4().hex}", [prompt_ids],
                [sampling_params(fields, model, max_tokens, logprobs)], text_options(fields),
                request.cache_salt if request.HasField("cache_salt") else None, arrival,
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
        try:
            async for delta in generation.deltas():
                choice = pb.ChoiceDelta(
                    index=delta.index,
                    text=delta.text,
                    token_ids=delta.token_ids,
                    logprobs=_logprobs(model, delta),
                    finish_reason=_FINISH_REASONS.get(delta.finish_reason or "", 0),
                )
                if isinstance(delta.stop_reason, str):
                    choice.stop_string = delta.stop_reason
                elif isinstance(delta.stop_reason, int):
                    choice.stop_token_id = delta.stop_reason
                yield pb.CompletionResponse(request_id=request_id, choices=[choice])
            usage = generation.usage
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
