"""Exclusive wall time per category, from wrapped calls (bench/step_profile.py).

`Attribution.wrap(fn, category)` returns `fn` timed: each call's time goes to
its category *minus* the time of the wrapped calls inside it, so nested wraps
(a decoder layer around its linears) never count a microsecond twice, and the
categories of one engine step add up to the step exactly. On CPU every op runs
synchronously on the calling thread, so wall time inside a call is the op's time.

`StepLog` cuts the running totals into steps: `begin(kind)` / `end()` around
each engine step; the time from one step's end to the next one's beginning (the
caller's loop) goes to `BETWEEN_STEPS` of the earlier step.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

BETWEEN_STEPS = "offline loop between steps (LLM.generate)"


class Attribution:
    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.totals: dict[str, float] = defaultdict(float)  # seconds, exclusive
        self.calls: dict[str, int] = defaultdict(int)
        self._stack: list[list[float]] = []  # per open call: [time of wrapped children]

    def wrap(self, fn: Callable, category: str) -> Callable:
        clock, stack, totals, calls = self.clock, self._stack, self.totals, self.calls

        def timed(*args: Any, **kwargs: Any) -> Any:
            children = [0.0]
            stack.append(children)
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = clock() - start
                stack.pop()
                totals[category] += elapsed - children[0]
                calls[category] += 1
                if stack:
                    stack[-1][0] += elapsed

        timed.__wrapped__ = fn  # type: ignore[attr-defined]
        return timed

    def snapshot(self) -> dict[str, float]:
        return dict(self.totals)


class StepLog:
    """Per step: its kind and the seconds each category took in it."""

    def __init__(self, attribution: Attribution) -> None:
        self.attribution = attribution
        self.steps: list[tuple[str, dict[str, float]]] = []
        self._before: dict[str, float] | None = None
        self._kind = ""
        self._last_end: float | None = None

    def begin(self, kind: str) -> None:
        now = self.attribution.clock()
        if self._last_end is not None and self.steps:
            self.steps[-1][1][BETWEEN_STEPS] = now - self._last_end
        self._before = self.attribution.snapshot()
        self._kind = kind

    def set_kind(self, kind: str) -> None:
        self._kind = kind

    def end(self) -> None:
        after = self.attribution.snapshot()
        before = self._before or {}
        delta = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
        self.steps.append((self._kind, delta))
        self._last_end = self.attribution.clock()


def step_kind(num_scheduled_tokens: list[int]) -> str:
    """`decode` (every request one token), `prefill` (none one token) or `mixed`.
    A prompt's last chunk of exactly one token reads as decode: rare, and cheap."""
    if not num_scheduled_tokens:
        return "empty"
    singles = sum(1 for n in num_scheduled_tokens if n == 1)
    if singles == len(num_scheduled_tokens):
        return "decode"
    return "prefill" if singles == 0 else "mixed"


def summarize_steps(
    steps: list[tuple[str, dict[str, float]]], categories: list[str]
) -> dict[str, dict[str, Any]]:
    """Per kind (and `all`): step count and mean ms per step of each category,
    in `categories` order (categories seen but not listed follow)."""
    order = list(categories)
    for _, delta in steps:
        order += [c for c in delta if c not in order]
    kinds: dict[str, list[dict[str, float]]] = {"all": []}
    for kind, delta in steps:
        kinds["all"].append(delta)
        kinds.setdefault(kind, []).append(delta)
    out = {}
    for kind, deltas in kinds.items():
        n = len(deltas)
        if n == 0:
            continue
        out[kind] = {
            "count": n,
            "ms_per_step": {c: 1000 * sum(d.get(c, 0.0) for d in deltas) / n for c in order},
        }
    return out
