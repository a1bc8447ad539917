"""Response pieces shared by completions and chat: usage, logprobs, SSE framing,
and a whole generation collected for a non-streaming answer."""

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from router.errors import describe
from router.generation import Generation, Usage
from router.text.choice_text import TextDelta
from router.text.tokenizer import Tokenizer
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb

# JSON has no -inf; OpenAI clients expect a number.
_MIN_LOGPROB = -9999.0
SSE_DONE = b"data: [DONE]\n\n"
# A stream's headers go out before a failover can happen: its finish chunks (and
# usage chunk) name the workers in this field instead, as the header does.
WORKER_FIELD = "pagoda_worker"


# Characters JSON leaves raw that line splitters other than SSE's own (Python's
# str.splitlines, as httpx's aiter_lines uses) take for line ends: escaped, so a
# model that writes one never cuts an event in two.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def sse(data: dict[str, Any]) -> bytes:
    """One server-sent event, as OpenAI frames them: a `data:` line and a blank line."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":")).translate(_LINE_BREAKS)
    return b"data: " + text.encode() + b"\n\n"


class Envelope:
    """What every object of one answer repeats (id, object type, creation time, model),
    and the pieces made of it: the whole answer, a chunk, the stream's end."""

    def __init__(
        self, generation: Generation, model: str, kind: str, include_usage: bool = False
    ) -> None:
        self.fields = {
            "id": generation.request_id,
            "object": kind,
            "created": int(time.time()),
            "model": model,
        }
        self._generation = generation
        self._include_usage = include_usage

    def whole(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {**self.fields, "choices": choices, "usage": usage_dict(self._generation.usage)}

    def chunk(self, choice: dict[str, Any]) -> bytes:
        body: dict[str, Any] = {**self.fields, "choices": [choice]}
        if self._include_usage:  # OpenAI: null on every chunk but the usage chunk
            body["usage"] = None
        if choice.get("finish_reason") is not None:
            body[WORKER_FIELD] = self.workers()
        return sse(body)

    def workers(self) -> str:
        """The x-pagoda-worker value: every worker that served the request so far."""
        return ",".join(self._generation.worker_ids)

    def end(self) -> Iterator[bytes]:
        """The usage-only chunk (when asked for), then [DONE]."""
        if self._include_usage:
            usage = usage_dict(self._generation.usage)
            yield sse({**self.fields, "choices": [], "usage": usage, WORKER_FIELD: self.workers()})
        yield SSE_DONE


def usage_dict(usage: Usage) -> dict[str, Any]:
    """OpenAI's usage; after a failover, prompt_tokens_details also says what the
    resumed prefills took and had cached (the client's prompt counts once in
    prompt_tokens and cached_tokens, which stay what the first prefill found)."""
    details: dict[str, Any] = {"cached_tokens": usage.cached_tokens}
    if usage.resumed_prefill_tokens:
        details["resumed_prefill_tokens"] = usage.resumed_prefill_tokens
        details["resumed_cached_tokens"] = usage.resumed_cached_tokens
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": details,
    }


def _logprob(value: float) -> float:
    return max(value, _MIN_LOGPROB) if not math.isnan(value) else _MIN_LOGPROB


@dataclass(frozen=True)
class LogprobFormat:
    """How one request wants its logprobs written."""

    tokenizer: Tokenizer
    as_token_ids: bool = False  # vLLM's return_tokens_as_token_ids
    top_with_sampled: bool = True  # the sampled token among the top ones (k + 1 at most)

    def token(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.as_token_ids else self.tokenizer.token_text(token_id)

    def top(self, entry: wpb.TokenLogprob) -> list[tuple[int, float]]:
        """The top alternatives, most likely first, and the sampled token when it is not
        among them, as OpenAI and vLLM list them."""
        top = [(t.token_id, t.logprob) for t in entry.top]
        if self.top_with_sampled and all(t != entry.token_id for t, _ in top):
            top.append((entry.token_id, entry.logprob))
        return top


def completion_logprobs(
    fmt: LogprobFormat,
    token_ids: Sequence[int],
    entries: Sequence[wpb.TokenLogprob | None],
    text_offset: int = 0,
) -> dict[str, Any]:
    """The legacy completions format; an entry of None (the first prompt token) has no logprob."""
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    for token_id, entry in zip(token_ids, entries):
        text = fmt.token(token_id)
        tokens.append(text)
        offsets.append(text_offset)
        text_offset += len(text)
        if entry is None:
            token_logprobs.append(None)
            top_logprobs.append(None)
        else:
            token_logprobs.append(_logprob(entry.logprob))
            top_logprobs.append({fmt.token(t): _logprob(lp) for t, lp in fmt.top(entry)})
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": offsets,
    }


def chat_logprobs(fmt: LogprobFormat, entries: Sequence[wpb.TokenLogprob]) -> dict[str, Any]:
    def item(token_id: int, logprob: float) -> dict[str, Any]:
        return {
            "token": fmt.token(token_id),
            "logprob": _logprob(logprob),
            "bytes": fmt.tokenizer.token_bytes(token_id),
        }

    content = [
        {
            **item(e.token_id, e.logprob),
            "top_logprobs": [item(t, lp) for t, lp in fmt.top(e)],
        }
        for e in entries
    ]
    return {"content": content, "refusal": None}


def prompt_logprobs(
    fmt: LogprobFormat, entries: Sequence[wpb.TokenLogprob]
) -> list[dict[str, Any] | None]:
    """vLLM's prompt_logprobs: per prompt position, None for the first token, then
    {token id: {logprob, rank, decoded_token}} for the prompt's own token and the top ones."""
    result: list[dict[str, Any] | None] = [None]
    for entry in entries:
        position = {
            str(entry.token_id): {
                "logprob": _logprob(entry.logprob),
                "rank": entry.rank,
                "decoded_token": fmt.token(entry.token_id),
            }
        }
        for rank, top in enumerate(entry.top, start=1):
            position.setdefault(
                str(top.token_id),
                {
                    "logprob": _logprob(top.logprob),
                    "rank": rank,
                    "decoded_token": fmt.token(top.token_id),
                },
            )
        result.append(position)
    return result


@dataclass
class ChoiceResult:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[wpb.TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    def add(self, delta: TextDelta) -> None:
        self.text += delta.text
        self.token_ids.extend(delta.token_ids)
        self.logprobs.extend(delta.logprobs)
        if delta.finish_reason is not None:
            self.finish_reason, self.stop_reason = delta.finish_reason, delta.stop_reason


async def collect(generation: Generation) -> list[ChoiceResult]:
    """Run a generation to its end; one result per choice, by index."""
    results = [ChoiceResult(i) for i in range(len(generation.prompts) * generation.n)]
    async for delta in generation.deltas():
        results[delta.index].add(delta)
    return results


async def guarded_sse(
    events: AsyncIterator[bytes], generation: Generation, on_done: Callable[[str], None]
) -> AsyncIterator[bytes]:
    """An SSE body that always ends well-formed: a failure mid-stream becomes an
    OpenAI-shaped error event (the openai client raises it), then [DONE].
    `on_done` gets the outcome for the metrics: "200", "stream_error" or "499"
    (the client went away)."""
    outcome = "499"
    try:
        async for event in events:
            yield event
        outcome = "200"
    except Exception as exc:
        outcome = "stream_error"
        _, body = describe(exc)
        yield sse(body)
        yield SSE_DONE
    finally:
        generation.close()
        on_done(outcome)
