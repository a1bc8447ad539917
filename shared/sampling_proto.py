"""`SamplingParams` to and from its protobuf message (protos/pagoda/v1/sampling.proto).

`params_from_proto` is the validation both services run: the router on what
a client sent (after applying the model's defaults), the worker on what the
router sent. Unset fields take the engine defaults, except `max_tokens`:
unset means "up to the context length".
"""

from __future__ import annotations

from typing import Any

from shared.errors import InvalidRequestError
from shared.proto.pagoda.v1 import sampling_pb2 as pb
from shared.sampling_params import SamplingParams
from shared.structured_outputs import StructuredOutputsParams

# Applied by the router; text never crosses the router-worker wire.
ROUTER_FIELDS = (
    "stop",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "spaces_between_special_tokens",
    "bad_words",
    "truncate_prompt_tokens",
)
_OPTIONAL = (
    "n", "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "max_tokens", "min_tokens", "ignore_eos",
    "logprobs", "prompt_logprobs", "stream_interval",
)  # fmt: skip


def _is_set(msg: pb.SamplingParams, name: str) -> bool:
    descriptor = msg.DESCRIPTOR.fields_by_name[name]
    if descriptor.has_presence:
        return msg.HasField(name)
    return len(getattr(msg, name)) > 0


def check_no_router_fields(msg: pb.SamplingParams) -> None:
    """A worker's check: the router's options must have been applied and cleared."""
    for name in ROUTER_FIELDS:
        if _is_set(msg, name):
            raise InvalidRequestError(
                f"sampling_params.{name}",
                "is applied by the router (workers take token ids only); send the request "
                "through a router, or apply it before calling the worker",
            )


def params_from_proto(msg: pb.SamplingParams) -> SamplingParams:
    """The message's token-level fields as validated SamplingParams (the router's
    fields are not read)."""
    kwargs: dict[str, Any] = {"max_tokens": None}
    for name in _OPTIONAL:
        if msg.HasField(name):
            kwargs[name] = getattr(msg, name)
    if msg.logit_bias:
        kwargs["logit_bias"] = dict(msg.logit_bias)
    if msg.stop_token_ids:
        kwargs["stop_token_ids"] = tuple(msg.stop_token_ids)
    if msg.allowed_token_ids:
        kwargs["allowed_token_ids"] = tuple(msg.allowed_token_ids)
    if msg.bad_words_token_ids:
        kwargs["bad_words_token_ids"] = tuple(tuple(w.ids) for w in msg.bad_words_token_ids)
    if msg.HasField("structured_outputs"):
        kwargs["structured_outputs"] = structured_from_proto(msg.structured_outputs)
    return SamplingParams(**kwargs)  # validates itself, naming the field


def structured_from_proto(msg: pb.StructuredOutputs) -> StructuredOutputsParams:
    kind = msg.WhichOneof("constraint")
    if kind is None:
        raise InvalidRequestError("structured_outputs", "is set but holds no constraint")
    if kind == "choice":
        return StructuredOutputsParams(choice=tuple(msg.choice.choices))
    if kind == "json_object":
        if not msg.json_object:
            raise InvalidRequestError("structured_outputs.json_object", "must be true when set")
        return StructuredOutputsParams(json_object=True)
    return StructuredOutputsParams(**{kind: getattr(msg, kind)})


def structured_to_proto(params: StructuredOutputsParams) -> pb.StructuredOutputs:
    msg = pb.StructuredOutputs()
    if params.choice is not None:
        msg.choice.choices.extend(params.choice)
    elif params.json_object:
        msg.json_object = True
    else:
        setattr(msg, params.kind, getattr(params, params.kind))
    return msg


def params_to_proto(params: SamplingParams) -> pb.SamplingParams:
    """Every field explicit, so the receiver applies no defaults of its own."""
    msg = pb.SamplingParams()
    for name in _OPTIONAL:
        value = getattr(params, name)
        if value is not None:
            try:
                setattr(msg, name, value)
            except (ValueError, TypeError) as exc:  # e.g. a seed beyond 64 bits
                raise InvalidRequestError(name, f"out of range: {exc}") from None
    msg.logit_bias.update({int(k): float(v) for k, v in params.logit_bias.items()})
    msg.stop_token_ids.extend(params.stop_token_ids)
    msg.allowed_token_ids.extend(params.allowed_token_ids or ())
    for word in params.bad_words_token_ids:
        msg.bad_words_token_ids.add(ids=word)
    if params.structured_outputs is not None:
        msg.structured_outputs.CopyFrom(structured_to_proto(params.structured_outputs))
    return msg


def with_defaults(msg: pb.SamplingParams, defaults: pb.SamplingParams) -> pb.SamplingParams:
    """`msg` with each unset field taken from `defaults` (the model's recommendations)."""
    merged = pb.SamplingParams()
    merged.CopyFrom(defaults)
    for name in merged.DESCRIPTOR.fields_by_name:
        if _is_set(msg, name):
            merged.ClearField(name)
    merged.MergeFrom(msg)
    return merged
