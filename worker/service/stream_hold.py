"""Streaming every N tokens instead of every token (vLLM's --stream-interval).

Each token a stream carries costs CPU outside the engine: the worker's event
loop and gRPC write, the router's detokenizer, SSE chunk and socket write, the
client's read. On a CPU host those run on the cores the model runs on, and
every burst of them preempts a compute thread. With an interval of N the
engine thread holds a request's deltas until N tokens (per sample) are waiting, so
all of that runs once per N tokens; the request hub merges the held deltas into
one response, which the router turns into one chunk.

Like vLLM: a request's first tokens and its last go out at once; a request's
own `stream_interval` can raise the worker's, never lower it. Held deltas die
with their request (an abort, a failed step): a stream that fails is resumed
elsewhere from the tokens its router has, and the held ones are made again.
Stop strings are the router's, so a request that hits one mid-hold runs up to
N - 1 tokens past it before the router's cancel lands.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from worker.outputs import RequestDelta


@dataclass
class _Held:
    interval: int
    deltas: list[RequestDelta] = field(default_factory=list)
    tokens: int = 0  # in `deltas`: per step, the most any one sample got
    sent_tokens: bool = False


class StreamHold:
    """Per request, the deltas not yet handed to its stream. Engine thread only."""

    def __init__(self, interval: int = 1) -> None:
        if interval < 1:
            raise ValueError(f"stream interval must be >= 1, got {interval}")
        self.interval = interval
        self._held: dict[str, _Held] = {}

    def open(self, engine_id: str, request_interval: int | None) -> None:
        interval = max(self.interval, request_interval or 1)
        if interval > 1:  # at 1 a request never enters: its deltas pass straight through
            self._held[engine_id] = _Held(interval)

    def close(self, engine_id: str) -> None:
        """The request is over (finished, aborted, failed); anything it held is dropped."""
        self._held.pop(engine_id, None)

    def offer(self, engine_id: str, deltas: list[RequestDelta]) -> list[RequestDelta] | None:
        """This step's deltas of a request; returns what to send now (None: hold)."""
        held = self._held.get(engine_id)
        if held is None:
            return deltas
        held.deltas.extend(deltas)
        # Counted per sample, not summed over samples: n samples advance together.
        held.tokens += max((len(d.new_token_ids) for d in deltas), default=0)
        finished = any(d.finished for d in deltas)
        if not (finished or not held.sent_tokens or held.tokens >= held.interval):
            return None
        out = held.deltas
        held.deltas, held.tokens = [], 0
        held.sent_tokens = held.sent_tokens or any(d.new_token_ids for d in out)
        return out
