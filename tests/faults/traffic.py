"""Steady traffic for fault tests: client threads sending requests back to back
(streamed and whole, greedy and seeded) and sorting every outcome.

```
completed   a finish reason (and, for greedy ones, the undisturbed run's text)
error       a clear error: an HTTP status with an OpenAI body, an SSE error event,
            or a refused / reset connection (the router itself went away)
lost        ended without a finish reason or an error, or with the wrong text
hung        no answer within HANG_S
```
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import openai

from tests.router.conftest import MODEL

HANG_S = 90.0
PROMPTS = [f"steady traffic {i}" for i in range(8)]


@dataclass
class Traffic:
    base_url: str
    api_key: str
    num_clients: int = 8
    max_tokens: int = 48
    outcomes: Counter = field(default_factory=Counter)
    expected: dict = field(default_factory=dict)  # (prompt, stream) -> greedy text
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    last_error: BaseException | None = None

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.base_url}/v1", api_key=self.api_key, max_retries=0, timeout=HANG_S
        )

    def one(self, client: openai.OpenAI, i: int) -> str:
        """Send request number i; its outcome."""
        prompt, stream = PROMPTS[i % len(PROMPTS)], i % 2 == 0
        greedy = i % 3 != 2
        params = {"max_tokens": self.max_tokens, "temperature": 0 if greedy else 1.0}
        if not greedy:
            params["seed"] = i % 5
        text, finish = "", None
        try:
            if stream:
                for chunk in client.completions.create(
                    model=MODEL, prompt=prompt, stream=True, **params
                ):
                    if chunk.choices:
                        text += chunk.choices[0].text
                        finish = chunk.choices[0].finish_reason or finish
            else:
                answer = client.completions.create(model=MODEL, prompt=prompt, **params)
                text, finish = answer.choices[0].text, answer.choices[0].finish_reason
        except openai.APITimeoutError:
            return "hung"
        except (openai.APIError, httpx.HTTPError) as exc:
            self.last_error = exc
            return "error"
        if finish is None or finish == "abort":
            return "lost"
        if greedy:
            want = self.expected.setdefault((prompt, self.max_tokens), text)
            if text != want:
                return "lost"
        return "completed"

    def _run(self, worker: int) -> None:
        client = self.client()
        i = worker
        while not self._stop.is_set():
            outcome = self.one(client, i)
            with self._lock:
                self.outcomes[outcome] += 1
            i += self.num_clients

    def warm_up(self) -> None:
        """The undisturbed greedy texts, before any fault."""
        client = self.client()
        for i in range(2 * len(PROMPTS)):
            outcome = self.one(client, i)
            assert outcome == "completed", (i, outcome, self.last_error)

    def start(self) -> None:
        for worker in range(self.num_clients):
            thread = threading.Thread(target=self._run, args=(worker,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> Counter:
        self._stop.set()
        deadline = time.monotonic() + HANG_S + 10
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.1))
        self.outcomes["hung"] += sum(t.is_alive() for t in self._threads)
        return self.outcomes

    @property
    def num_sent(self) -> int:
        return sum(self.outcomes.values())
