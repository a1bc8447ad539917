"""From a client's SamplingParams message to what each prompt's worker is sent.

Both fronts end here: the OpenAI API builds the message from its JSON fields
(router/openai/sampling.py), the gRPC API receives it as is. Per request:

```
client message ── with the model's defaults (generation_config.json) for unset fields
   │  router options: stop strings and text options -> TextOptions,
   │                  bad_words -> token id sequences, truncate_prompt_tokens -> prompts
   │  max_tokens from the context left (and the model's max_new_tokens)
   ▼
shared.sampling_proto.params_from_proto  (the worker's own validation)
   ▼
worker message per prompt: token-level fields only
```
"""

from __future__ import annotations

from dataclasses import dataclass

from router.generation import TextOptions
from router.model import ModelContext
from shared.errors import InvalidRequestError
from shared.proto.pagoda.v1 import sampling_pb2 as pb
from shared.sampling_proto import ROUTER_FIELDS, params_from_proto, with_defaults

MAX_STOP_STRINGS = 64
MAX_STOP_STRING_CHARS = 1024
MAX_BAD_WORDS = 256
MAX_BAD_WORD_CHARS = 256


@dataclass(frozen=True)
class SamplingPlan:
    prompts: list[list[int]]  # after truncate_prompt_tokens
    params: list[pb.SamplingParams]  # per prompt, as its worker gets it
    text: TextOptions


def text_options(msg: pb.SamplingParams) -> TextOptions:
    stop = [s for s in msg.stop]
    if len(stop) > MAX_STOP_STRINGS:
        raise InvalidRequestError(
            "stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}"
        )
    long = next((s for s in stop if len(s) > MAX_STOP_STRING_CHARS), None)
    if long is not None:
        raise InvalidRequestError(
            "stop", f"a stop string may have at most {MAX_STOP_STRING_CHARS} characters, "
            f"got one of {len(long)}",
        )  # fmt: skip

    def flag(name: str, default: bool) -> bool:
        return getattr(msg, name) if msg.HasField(name) else default

    return TextOptions(
        stop=tuple(stop),
        include_stop_str_in_output=flag("include_stop_str_in_output", False),
        skip_special_tokens=flag("skip_special_tokens", True),
        spaces_between_special_tokens=flag("spaces_between_special_tokens", True),
        min_tokens=msg.min_tokens,
    )


async def bad_words_token_ids(model: ModelContext, words: list[str]) -> list[list[int]]:
    """Each word as its token ids, alone and after a space when that spells it
    differently (as vLLM tokenizes bad_words: a word mid-text usually starts with
    its space)."""
    if len(words) > MAX_BAD_WORDS:
        raise InvalidRequestError("bad_words", f"at most {MAX_BAD_WORDS} words, got {len(words)}")
    sequences: list[list[int]] = []
    for word in words:
        if not word.strip() or len(word) > MAX_BAD_WORD_CHARS:
            raise InvalidRequestError(
                "bad_words",
                f"each word must have 1 to {MAX_BAD_WORD_CHARS} characters, got {word!r}",
            )
        plain = await model.encode(word.lstrip(), add_special_tokens=False)
        spaced = await model.encode(" " + word.lstrip(), add_special_tokens=False)
        sequences.append(plain)
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            sequences.append(spaced)
    return [s for s in sequences if s]


def _truncated(prompt: list[int], msg: pb.SamplingParams, model: ModelContext) -> list[int]:
    if not msg.HasField("truncate_prompt_tokens"):
        return prompt
    keep = msg.truncate_prompt_tokens
    if keep == -1:
        keep = model.limits.max_model_len
    if keep < 1:
        raise InvalidRequestError(
            "truncate_prompt_tokens", f"must be -1 or a positive integer, got {keep}"
        )
    return prompt[-keep:]


async def plan_sampling(
    model: ModelContext, request: pb.SamplingParams, prompts: list[list[int]], what: str
) -> SamplingPlan:
    """Validate a request's sampling for this model and make each prompt's worker
    message. `what` names the prompt in errors ("prompt" or "messages")."""
    msg = with_defaults(request, model.default_sampling_params)
    limit = model.limits.max_logprobs
    for name in ("logprobs", "prompt_logprobs"):
        if msg.HasField(name) and not 0 <= getattr(msg, name) <= limit:
            raise InvalidRequestError(name, f"must be in [0, {limit}], got {getattr(msg, name)}")
    text = text_options(msg)
    base = pb.SamplingParams()
    base.CopyFrom(msg)
    for name in ROUTER_FIELDS:
        base.ClearField(name)
    for word in await bad_words_token_ids(model, list(msg.bad_words)):
        base.bad_words_token_ids.add(ids=word)
    # A default max_tokens (the model's max_new_tokens) caps what the context leaves;
    # one the client asked for must fit.
    asked = request.max_tokens if request.HasField("max_tokens") else None
    default = msg.max_tokens if msg.HasField("max_tokens") and asked is None else None
    plans, params = [], []
    for prompt in prompts:
        prompt = _truncated(prompt, msg, model)
        max_tokens = model.check_prompt(prompt, asked, what)
        if default is not None:
            max_tokens = min(max_tokens, default)
        worker = pb.SamplingParams()
        worker.CopyFrom(base)
        worker.max_tokens = max_tokens
        params_from_proto(worker).validate_token_ids(model.limits.vocab_size)
        plans.append(prompt)
        params.append(worker)
    n = msg.n if msg.HasField("n") else 1
    model.request_limits.check_tokens(n, [p.max_tokens for p in params])
    return SamplingPlan(plans, params, text)
