"""Between protobuf messages and the engine's types; validation that is about the wire."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from shared.block_hash import BLOCK_HASH_SCHEME
from shared.errors import InvalidRequestError
from shared.proto.pagoda.v1 import sampling_pb2
from shared.proto.pagoda.worker.v1 import worker_pb2 as pb
from shared.registry import WorkerInfo, WorkerLoad
from shared.sampling_params import SamplingParams
from shared.sampling_proto import check_no_router_fields, params_from_proto, params_to_proto
from worker.engine.llm_engine import LLMEngine
from worker.outputs import RequestDelta, TokenLogprobs
from worker.service.config import WorkerIdentity

MAX_REQUEST_ID_LEN = 256
MAX_CACHE_SALT_BYTES = 1024

_FINISH_REASONS = {
    None: pb.FINISH_REASON_UNSPECIFIED,
    "stop": pb.FINISH_REASON_STOP,
    "length": pb.FINISH_REASON_LENGTH,
    "abort": pb.FINISH_REASON_ABORT,
}


def sampling_params_from_proto(msg: sampling_pb2.SamplingParams) -> SamplingParams:
    """The engine's SamplingParams, validated as the router validates them."""
    check_no_router_fields(msg)
    return params_from_proto(msg)


def check_request_fields(msg: pb.GenerateRequest) -> None:
    if len(msg.request_id) > MAX_REQUEST_ID_LEN:
        raise InvalidRequestError(
            "request_id",
            f"must be at most {MAX_REQUEST_ID_LEN} characters, got {len(msg.request_id)}",
        )
    if len(msg.cache_salt) > MAX_CACHE_SALT_BYTES:
        raise InvalidRequestError(
            "cache_salt", f"must be at most {MAX_CACHE_SALT_BYTES} bytes, got {len(msg.cache_salt)}"
        )


def _logprob(lp: TokenLogprobs) -> pb.TokenLogprob:
    return pb.TokenLogprob(
        token_id=lp.token_id,
        logprob=lp.logprob,
        rank=lp.rank,
        top=[pb.TopLogprob(token_id=t, logprob=v) for t, v in lp.top],
    )


def response_from_deltas(deltas: Sequence[RequestDelta], is_first: bool) -> pb.GenerateResponse:
    """One response from one or more steps' deltas of a request, merged per sample."""
    response = pb.GenerateResponse()
    if is_first:
        response.num_prompt_tokens = deltas[0].num_prompt_tokens
        response.num_cached_tokens = next(
            (d.num_cached_tokens for d in deltas if d.index == 0), deltas[0].num_cached_tokens
        )
    outputs: dict[int, pb.SampleOutput] = {}
    for delta in deltas:
        if delta.prompt_logprobs is not None and delta.index == 0:
            response.prompt_logprobs.extend(_logprob(lp) for lp in delta.prompt_logprobs)
        if not delta.new_token_ids and not delta.finished:
            continue
        out = outputs.get(delta.index)
        if out is None:
            out = outputs[delta.index] = response.outputs.add(index=delta.index)
        out.token_ids.extend(delta.new_token_ids)
        if delta.new_logprobs:
            out.logprobs.extend(_logprob(lp) for lp in delta.new_logprobs)
        if delta.finished:
            out.finish_reason = _FINISH_REASONS[delta.finish_reason]
            if delta.stop_reason is not None:
                out.stop_token_id = delta.stop_reason
    return response


def load_to_proto(load: WorkerLoad) -> pb.GetLoadResponse:
    fields = pb.GetLoadResponse.DESCRIPTOR.fields_by_name
    return pb.GetLoadResponse(**{k: v for k, v in dataclasses.asdict(load).items() if k in fields})


def worker_info(engine: LLMEngine, identity: WorkerIdentity, started_at_ms: int) -> WorkerInfo:
    config, budget = engine.config, engine.core.kv_budget
    return WorkerInfo(
        worker_id=identity.worker_id,
        address=identity.address,
        model=config.model.name,
        architecture=engine.spec.architecture,
        block_size=budget.block_size,
        max_model_len=engine.max_model_len,
        num_kv_blocks=budget.num_blocks,
        kv_capacity_tokens=budget.max_tokens,
        block_hash_scheme=BLOCK_HASH_SCHEME,
        enable_prefix_caching=config.cache.enable_prefix_caching,
        epoch=identity.epoch,
        started_at_ms=started_at_ms,
    )


def model_info(engine: LLMEngine, info: WorkerInfo, max_waiting: int) -> pb.GetModelInfoResponse:
    config, spec = engine.config, engine.spec
    response = pb.GetModelInfoResponse(
        served_model_name=info.model,
        model=config.model.model,
        tokenizer=config.model.tokenizer or config.model.model,
        architecture=info.architecture,
        vocab_size=spec.vocab_size,
        max_model_len=info.max_model_len,
        eos_token_ids=list(spec.eos_token_ids),
        block_size=info.block_size,
        block_hash_scheme=info.block_hash_scheme,
        enable_prefix_caching=info.enable_prefix_caching,
        num_kv_blocks=info.num_kv_blocks,
        kv_capacity_tokens=info.kv_capacity_tokens,
        max_num_seqs=config.scheduler.max_num_seqs,
        max_num_batched_tokens=config.scheduler.max_num_batched_tokens,
        max_waiting=max_waiting,
        max_logprobs=config.model.max_logprobs,
        worker_id=info.worker_id,
        epoch=info.epoch,
        dtype=str(engine.core.dtype).removeprefix("torch."),
    )
    if spec.bos_token_id is not None:
        response.bos_token_id = spec.bos_token_id
    response.default_sampling_params.CopyFrom(_defaults_to_proto(engine.sampling_defaults))
    return response


def _defaults_to_proto(defaults: dict) -> sampling_pb2.SamplingParams:
    """Only the fields the model recommends (the router fills unset fields from them)."""
    full = params_to_proto(SamplingParams(**defaults))
    message = sampling_pb2.SamplingParams()
    for name in defaults:
        setattr(message, name, getattr(full, name))
    return message
