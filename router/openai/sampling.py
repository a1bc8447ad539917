"""From a request's fields to the worker's SamplingParams and the router's text options.

Value ranges are checked by the engine's own `SamplingParams` (a plain
dataclass, no torch), so the router and the worker can never disagree on
what is valid, and a bad value is a 400 before any worker is bothered.
"""

from __future__ import annotations

import math
from typing import Any

from router.errors import UnsupportedFieldError
from router.generation import TextOptions
from router.model import ModelContext
from router.openai.protocol import SamplingFields
from shared.errors import InvalidRequestError
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb
from worker.engine.sampling_params import SamplingParams

MAX_N = 128
MAX_STOP_STRINGS = 64

# Fields declared only to be refused, with the values that change nothing.
_HARMLESS: dict[str, tuple[Any, ...]] = {
    "logits_processors": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "structured_outputs": (None,),
    "use_beam_search": (False,),
    "prompt_logprobs": (None,),
    "truncate_prompt_tokens": (None,),
    "allowed_token_ids": (None,),
    "bad_words": (None, []),
    "suffix": (None, ""),
    "tools": (None, []),
    "functions": (None, []),
    "function_call": (None, "none"),
    "tool_choice": (None, "none"),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "web_search_options": (None,),
    "continue_final_message": (False,),
    "chat_template": (None,),
    "chat_template_kwargs": (None, {}),
    "documents": (None,),
    "response_format": (None, {"type": "text"}),
    "modalities": (None, ["text"]),
}


def check_supported(request: SamplingFields) -> None:
    """400 naming the first field that is set to something Pagoda does not implement."""
    fields = type(request).model_fields
    for name, harmless in _HARMLESS.items():
        if name in fields and getattr(request, name) not in harmless:
            raise UnsupportedFieldError(name)
    if request.best_of is not None and request.best_of != request.n:
        raise UnsupportedFieldError("best_of")


def text_options(request: SamplingFields) -> TextOptions:
    stop = request.stop_list()
    if len(stop) > MAX_STOP_STRINGS:
        raise InvalidRequestError(
            "stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}"
        )
    return TextOptions(
        stop=tuple(stop),
        include_stop_str_in_output=request.include_stop_str_in_output,
        skip_special_tokens=request.skip_special_tokens,
    )


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


def sampling_params(
    request: SamplingFields,
    model: ModelContext,
    max_tokens: int,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
) -> wpb.SamplingParams:
    """Validate (the engine's rules, this model's limits) and convert for the worker."""
    if not 1 <= request.n <= MAX_N:
        raise InvalidRequestError("n", f"must be in [1, {MAX_N}], got {request.n}")
    set_fields = {
        name: getattr(request, name)
        for name in (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
        )
        if getattr(request, name) is not None
    }
    for name, value in set_fields.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidRequestError(name, f"must be a finite number, got {value}")
    limit = model.limits.max_logprobs
    for name, value in (("logprobs", logprobs), ("prompt_logprobs", prompt_logprobs)):
        if value is not None and not 0 <= value <= limit:
            raise InvalidRequestError(name, f"must be in [0, {limit}], got {value}")
    params = SamplingParams(
        n=request.n,
        max_tokens=max_tokens,
        min_tokens=request.min_tokens,
        logit_bias=_logit_bias(request.logit_bias),
        stop_token_ids=tuple(request.stop_token_ids or ()),
        ignore_eos=request.ignore_eos,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        **set_fields,
    )
    params.validate_token_ids(model.limits.vocab_size)
    try:
        message = wpb.SamplingParams(
            n=params.n,
            max_tokens=max_tokens,
            min_tokens=params.min_tokens,
            logit_bias=params.logit_bias,
            stop_token_ids=params.stop_token_ids,
            ignore_eos=params.ignore_eos,
            **set_fields,
        )
    except (ValueError, TypeError) as exc:  # e.g. a seed beyond 64 bits
        raise InvalidRequestError("request", f"a value is out of range: {exc}") from exc
    if logprobs is not None:
        message.logprobs = logprobs
    if prompt_logprobs is not None:
        message.prompt_logprobs = prompt_logprobs
    return message
