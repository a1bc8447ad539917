"""From an OpenAI request's fields to the one SamplingParams message.

Only fields the client set go into the message, so the model's defaults
(generation_config.json) fill the rest; validation is the shared one
(router/sampling.py), the same for the gRPC API and the worker.
"""

from __future__ import annotations

from typing import Any

from router.errors import UnsupportedFieldError
from router.openai.protocol import SamplingFields
from router.openai.structured_outputs import structured_outputs
from shared.errors import InvalidRequestError
from shared.proto.pagoda.v1 import sampling_pb2 as pb
from shared.sampling_proto import structured_to_proto
from shared.structured_outputs import StructuredOutputsParams

# Fields declared only to be refused, with the values that change nothing.
_HARMLESS: dict[str, tuple[Any, ...]] = {
    "logits_processors": (None,),
    "use_beam_search": (False,),
    "suffix": (None, ""),
    "functions": (None, []),
    "function_call": (None, "none"),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "web_search_options": (None,),
    "continue_final_message": (False,),
    "chat_template": (None,),
    "documents": (None,),
    "modalities": (None, ["text"]),
}
# Set on the message only when the client set them (None = unset).
_OPTIONAL = (
    "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "truncate_prompt_tokens", "stream_interval",
)  # fmt: skip
# Plain values the request always has (pydantic defaults = the engine's).
_ALWAYS = (
    "n", "min_tokens", "ignore_eos", "skip_special_tokens", "include_stop_str_in_output",
    "spaces_between_special_tokens",
)  # fmt: skip


def check_supported(request: SamplingFields) -> None:
    """400 naming the first field that is set to something Pagoda does not implement."""
    fields = type(request).model_fields
    for name, harmless in _HARMLESS.items():
        if name in fields and getattr(request, name) not in harmless:
            raise UnsupportedFieldError(name)
    if request.best_of is not None and request.best_of != request.n:
        raise UnsupportedFieldError("best_of")


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    result = {}
    for key, value in (bias or {}).items():
        try:
            result[int(key)] = float(value)
        except ValueError:
            raise InvalidRequestError(
                "logit_bias", f"keys must be token ids, got {key!r}"
            ) from None
    return result


def request_message(
    request: SamplingFields,
    max_tokens: int | None,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
    tool_constraint: StructuredOutputsParams | None = None,
) -> pb.SamplingParams:
    """The request's sampling fields as the message both fronts validate.
    tool_constraint: what tool_choice required or named demands (router/tools/)."""
    msg = pb.SamplingParams()
    constraint = structured_outputs(request)
    if tool_constraint is not None:
        if constraint is not None:
            raise InvalidRequestError(
                "tool_choice", "constrains the output to a tool call: drop response_format "
                "and the other output constraints, or set tool_choice to auto or none",
            )  # fmt: skip
        constraint = tool_constraint
    if constraint is not None:
        msg.structured_outputs.CopyFrom(structured_to_proto(constraint))
    values: dict[str, Any] = {name: getattr(request, name) for name in _ALWAYS}
    values.update(
        (name, getattr(request, name)) for name in _OPTIONAL if getattr(request, name) is not None
    )
    for name, value in (
        ("max_tokens", max_tokens),
        ("logprobs", logprobs),
        ("prompt_logprobs", prompt_logprobs),
    ):
        if value is not None:
            values[name] = value
    for name, value in values.items():
        try:
            setattr(msg, name, value)
        except (ValueError, TypeError) as exc:  # e.g. a seed beyond 64 bits
            raise InvalidRequestError(name, f"out of range: {exc}") from None
    try:
        msg.logit_bias.update(_logit_bias(request.logit_bias))
        msg.stop_token_ids.extend(request.stop_token_ids or ())
        msg.allowed_token_ids.extend(request.allowed_token_ids or ())
    except (ValueError, TypeError) as exc:  # token ids beyond 32 bits
        raise InvalidRequestError("request", f"a token id is out of range: {exc}") from None
    if request.allowed_token_ids is not None and not request.allowed_token_ids:
        raise InvalidRequestError("allowed_token_ids", "must list at least one token id")
    msg.stop.extend(request.stop_list())
    msg.bad_words.extend(request.bad_words or ())
    return msg
