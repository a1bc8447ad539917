"""POST /tokenize and /detokenize: the served model's tokenizer, in vLLM's shapes.

```
/tokenize    {"prompt": "..."}              -> {"count", "max_model_len", "tokens", "token_strs"}
             {"messages": [...]}            (rendered through the chat template first)
/detokenize  {"tokens": [...]}              -> {"prompt": "..."}
```

`model` may be left out (vLLM's habit); given, it must name the served model.
The ids are the ones a completion of the same prompt sends the worker: the
same `add_special_tokens` defaults (on for a prompt, off for messages, whose
template writes its own) and the same chat template.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from router.model import ModelContext
from router.openai.chat import template_messages
from router.openai.protocol import ChatMessage, _Body
from router.state import RouterState
from shared.errors import InvalidRequestError


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_special_tokens: bool | None = None  # default: on for a prompt, off for messages
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


def _model(state: RouterState, name: str | None) -> ModelContext:
    if name is None:
        return state.model_for(state.model.name if state.model is not None else "")
    return state.model_for(name)


async def tokenize(state: RouterState, request: TokenizeRequest) -> dict[str, Any]:
    model = _model(state, request.model)
    if (request.prompt is None) == (request.messages is None):
        raise InvalidRequestError("prompt", "give exactly one of prompt or messages")
    if request.prompt is not None:
        special = True if request.add_special_tokens is None else request.add_special_tokens
        token_ids = await model.encode(request.prompt, special)
    else:
        special = bool(request.add_special_tokens)
        _, token_ids = await model.render_chat(
            template_messages(request), request.add_generation_prompt, special
        )
    token_strs = None
    if request.return_token_strs:
        # The vocabulary's own pieces (e.g. "Ġthe"), as vLLM lists them.
        token_strs = [model.tokenizer.backend.id_to_token(t) for t in token_ids]
    return {
        "count": len(token_ids),
        "max_model_len": model.limits.max_model_len,
        "tokens": token_ids,
        "token_strs": token_strs,
    }


async def detokenize(state: RouterState, request: DetokenizeRequest) -> dict[str, Any]:
    model = _model(state, request.model)
    vocab = model.limits.vocab_size
    bad = next((t for t in request.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise InvalidRequestError(
            "tokens", f"token id {bad} is outside the vocabulary [0, {vocab})"
        )
    # vLLM decodes with special tokens kept: the text is what the ids say.
    return {"prompt": model.tokenizer.decode(request.tokens, skip_special_tokens=False)}
