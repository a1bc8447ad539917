"""One client request from token ids to text deltas, shared by the HTTP and gRPC fronts.

```
prompts (token ids) ──► Dispatcher.open() per prompt, concurrently ──► WorkerStream
WorkerStream responses ──► ChoiceText per sample (detokenize, stop strings) ──► TextDelta
```

Choice i of prompt p has index p * n + i, as OpenAI numbers them. The
request is over when every choice has finished: a stop string may finish
one before its worker does, and once all have, the worker call is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from router.metrics import RouterMetrics
from router.model import ModelContext
from router.routing.dispatcher import Dispatcher, WorkerJob
from router.routing.worker_stream import WorkerStream
from router.text.choice_text import ChoiceText, TextDelta, TextOptions
from shared.proto.pagoda.v1 import sampling_pb2
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb

_DONE = object()


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Generation:
    def __init__(
        self,
        model: ModelContext,
        dispatcher: Dispatcher,
        metrics: RouterMetrics,
        request_id: str,
        prompts: list[list[int]],
        params: list[sampling_pb2.SamplingParams],
        text: TextOptions,
        cache_salt: str | None,
        arrival: float,
        priority: int = 0,
    ) -> None:
        self._model = model
        self._dispatcher = dispatcher
        self._metrics = metrics
        self.request_id = request_id
        self.prompts = prompts
        self.params = params
        self.text = text
        self.cache_salt = cache_salt.encode() if cache_salt else None
        self.arrival = arrival
        self.priority = priority
        # One per prompt (max_tokens may differ); n is the same in all.
        self.n = params[0].n if params[0].HasField("n") else 1
        self.usage = Usage(prompt_tokens=sum(len(p) for p in prompts))
        self.streams: list[WorkerStream] = []
        # Per prompt: logprobs of positions 1.. when prompt_logprobs was asked for.
        self.prompt_logprobs: list[list[wpb.TokenLogprob]] = [[] for _ in prompts]

    @property
    def worker_ids(self) -> list[str]:
        return [s.worker_id for s in self.streams]

    async def start(self) -> None:
        """Open a worker stream per prompt; returns once each has its first response."""
        jobs = [
            WorkerJob(
                self.request_id if len(self.prompts) == 1 else f"{self.request_id}-{i}",
                prompt,
                self.params[i],
                self.cache_salt,
                self.arrival,
                self.priority,
            )
            for i, prompt in enumerate(self.prompts)
        ]
        tasks = [asyncio.ensure_future(self._dispatcher.open(job)) for job in jobs]
        try:
            self.streams = list(await asyncio.gather(*tasks))
        except BaseException:  # one failed, or the client left: close what did open
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for result in results:
                if isinstance(result, WorkerStream):
                    result.close()
            raise
        self.usage.cached_tokens = sum(s.num_cached_tokens for s in self.streams)
        self._metrics.prompt_tokens.inc(self.usage.prompt_tokens)
        self._metrics.cached_tokens.inc(self.usage.cached_tokens)

    def close(self) -> None:
        for stream in self.streams:
            stream.close()

    async def deltas(self) -> AsyncIterator[TextDelta]:
        """Every choice's deltas until all have finished (one prompt's in order)."""
        if len(self.streams) == 1:
            async with contextlib.aclosing(self._prompt_deltas(0)) as deltas:
                async for delta in deltas:
                    yield delta
            return
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(index: int) -> None:
            try:
                async for delta in self._prompt_deltas(index):
                    queue.put_nowait(delta)
            except BaseException as exc:  # handed to the consumer
                queue.put_nowait(exc)
            finally:
                queue.put_nowait(_DONE)

        tasks = [asyncio.create_task(pump(i)) for i in range(len(self.streams))]
        try:
            remaining = len(tasks)
            while remaining:
                item = await queue.get()
                if item is _DONE:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.close()

    async def _prompt_deltas(self, prompt_index: int) -> AsyncIterator[TextDelta]:
        stream, prompt = self.streams[prompt_index], self.prompts[prompt_index]
        choices = [
            ChoiceText(prompt_index * self.n + i, self._model.tokenizer, prompt, self.text)
            for i in range(self.n)
        ]
        try:
            async with contextlib.aclosing(stream.responses()) as responses:
                async for response in responses:
                    self.prompt_logprobs[prompt_index].extend(response.prompt_logprobs)
                    for output in response.outputs:
                        delta = choices[output.index].push(output)
                        if delta is not None:
                            yield delta
                    if all(c.is_finished for c in choices):
                        break
        finally:
            num_tokens = sum(c.num_tokens for c in choices)
            self.usage.completion_tokens += num_tokens
            self._metrics.generation_tokens.inc(num_tokens)
