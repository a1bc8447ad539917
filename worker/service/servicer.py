"""The gRPC handlers of pagoda.worker.v1.WorkerService, and how errors become statuses.

Every error a handler meets ends its call with a status, never the process:
PagodaError subclasses carry their own gRPC code (INVALID_ARGUMENT,
RESOURCE_EXHAUSTED, UNAVAILABLE, ...); anything else is INTERNAL and logged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import NoReturn

import grpc

from shared.errors import PagodaError, UnavailableError
from shared.logging import get_logger
from shared.proto.pagoda.worker.v1 import worker_pb2 as pb
from shared.proto.pagoda.worker.v1 import worker_pb2_grpc as pb_grpc
from shared.registry import WorkerLoad
from worker.service import convert
from worker.service.request_hub import RequestHub

logger = get_logger(__name__)


async def abort_with(context: grpc.aio.ServicerContext, exc: BaseException) -> NoReturn:
    if isinstance(exc, PagodaError):
        code, message = grpc.StatusCode[exc.grpc_code], str(exc)
    else:
        logger.error("unexpected error in a handler", exc_info=exc)
        code, message = grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"
    await context.abort(code, message)
    raise AssertionError("context.abort returned")  # it always raises


class WorkerServicer(pb_grpc.WorkerServiceServicer):
    def __init__(
        self,
        hub: RequestHub,
        model_info: Callable[[], pb.GetModelInfoResponse | None],
        load: Callable[[], WorkerLoad],
    ) -> None:
        self._hub = hub
        self._model_info = model_info
        self._load = load

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        # Headers now, not with the first token: grpcio leaks ~100 B of native memory
        # in the caller for each call it cancels before any headers came back
        # (grpc/grpc#43360), and a router cancels every call whose client left while
        # its request waited or prefilled (bench/grpc_cancel_leak.py: 98 -> 4 B).
        await context.send_initial_metadata(())
        try:
            convert.check_request_fields(request)
            params = convert.sampling_params_from_proto(request.sampling_params)
            grammar = await self._hub.compile_grammar(params)
            stream = self._hub.open(
                request.request_id,
                list(request.prompt_token_ids),
                params,
                priority=request.priority,
                cache_salt=request.cache_salt if request.HasField("cache_salt") else None,
                grammar=grammar,
                output_token_ids=list(request.output_token_ids),
            )
        except Exception as exc:
            await abort_with(context, exc)
        try:
            async for response in stream.responses():
                yield response
        except Exception as exc:
            await abort_with(context, exc)
        finally:
            # Also on cancellation, disconnect or deadline (CancelledError / GeneratorExit).
            self._hub.close(stream)

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetModelInfoResponse:
        info = self._model_info()
        if info is None:
            await abort_with(context, UnavailableError("the worker is still loading its model"))
        return info

    async def GetLoad(
        self, request: pb.GetLoadRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetLoadResponse:
        try:
            return convert.load_to_proto(self._load())
        except Exception as exc:
            await abort_with(context, exc)
