"""One client request from token ids to text deltas, shared by the HTTP and gRPC fronts.

```
prompts (token ids) ──► Dispatcher.open() per prompt, concurrently ──► WorkerStream
WorkerStream responses ──► ChoiceText per sample (detokenize, stop strings) ──► TextDelta
```

Choice i of prompt p has index p * n + i, as OpenAI numbers them. The
request is over when every choice has finished: a stop string may finish
one before its worker does, and once all have, the worker call is cancelled.

A worker that fails after tokens have streamed (dies, hangs, turns UNAVAILABLE)
does not end the stream: the prompt's request is resumed on another worker with
the tokens generated so far (Dispatcher.resume), up to `--migration-limit` times,
and its responses continue the same choices (detokenizer and stop-string state
carry over). That needs one sample per prompt (n = 1). A stream that does end
early ends each unfinished choice with finish_reason "abort", then the error.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from router.metrics import RouterMetrics
from router.model import ModelContext
from router.routing.dispatcher import Dispatcher, WorkerJob
from router.routing.worker_stream import WorkerFailedError, WorkerStream
from router.text.choice_text import ChoiceText, TextDelta, TextOptions
from shared.errors import PagodaError
from shared.logging import get_logger
from shared.proto.pagoda.v1 import sampling_pb2
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb

logger = get_logger(__name__)
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
        self._jobs: list[WorkerJob] = []
        self._interrupted: PagodaError | None = None
        self._start_tasks: list[asyncio.Future] = []
        self.num_migrations = 0
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
                timeout=self._dispatcher.request_timeout,
            )
            for i, prompt in enumerate(self.prompts)
        ]
        self._jobs = jobs
        tasks = self._start_tasks = [
            asyncio.ensure_future(self._dispatcher.open(job)) for job in jobs
        ]
        self._dispatcher.generations.add(self)
        try:
            self.streams = list(await asyncio.gather(*tasks))
        except BaseException:  # one failed, or the client left: close what did open
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for result in results:
                if isinstance(result, WorkerStream):
                    result.close()
            if self._interrupted is not None:
                raise self._interrupted from None
            raise
        self.usage.cached_tokens = sum(s.num_cached_tokens for s in self.streams)
        self._metrics.prompt_tokens.inc(self.usage.prompt_tokens)
        self._metrics.cached_tokens.inc(self.usage.cached_tokens)

    def close(self) -> None:
        self._dispatcher.generations.discard(self)
        for stream in self.streams:
            stream.close()

    def interrupt(self, error: PagodaError) -> None:
        """End the generation from outside (shutdown): its streams end with `error`."""
        self._interrupted = error
        for task in self._start_tasks:
            task.cancel()
        for stream in self.streams:
            stream.interrupt(error)

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
        prompt = self.prompts[prompt_index]
        choices = [
            ChoiceText(prompt_index * self.n + i, self._model.tokenizer, prompt, self.text)
            for i in range(self.n)
        ]
        generated: list[int] = []  # sample 0's tokens, to resume from
        try:
            while True:
                stream = self.streams[prompt_index]
                try:
                    async with contextlib.aclosing(stream.responses()) as responses:
                        async for response in responses:
                            self.prompt_logprobs[prompt_index].extend(response.prompt_logprobs)
                            for output in response.outputs:
                                if output.index == 0:
                                    generated.extend(output.token_ids)
                                delta = choices[output.index].push(output)
                                if delta is not None:
                                    yield delta
                            if all(c.is_finished for c in choices):
                                break
                    return
                except WorkerFailedError as exc:
                    if not self._may_resume(generated):
                        raise
                    if len(generated) >= self._jobs[prompt_index].params.max_tokens:
                        # Every token was sent; only the finish was lost with the worker.
                        end = wpb.SampleOutput(finish_reason=wpb.FINISH_REASON_LENGTH)
                        delta = choices[0].push(end)
                        if delta is not None:
                            yield delta
                        return
                    logger.warning(
                        "request %s: %s; resuming it elsewhere after %d tokens",
                        self.request_id,
                        exc,
                        len(generated),
                    )
                    await self._resume(prompt_index, generated, stream)
        except PagodaError as exc:
            # A stream never ends in silence: each open choice says it was cut short.
            if self._interrupted is not None and not isinstance(exc, type(self._interrupted)):
                exc = self._interrupted
            for choice in choices:
                if not choice.is_finished:
                    end = wpb.SampleOutput(finish_reason=wpb.FINISH_REASON_ABORT)
                    delta = choice.push(end)
                    if delta is not None:
                        yield delta
            raise exc
        finally:
            num_tokens = sum(c.num_tokens for c in choices)
            self.usage.completion_tokens += num_tokens
            self._metrics.generation_tokens.inc(num_tokens)

    def _may_resume(self, generated: list[int]) -> bool:
        limit = self._dispatcher.migration_limit
        return self._interrupted is None and self.n == 1 and self.num_migrations < limit

    async def _resume(self, prompt_index: int, generated: list[int], failed: WorkerStream) -> None:
        """Open the prompt's request on another worker, continuing after `generated`."""
        self.num_migrations += 1
        self._metrics.migrations.inc()
        job, stream = await self._dispatcher.resume(
            self._jobs[prompt_index], generated, failed.handle.address
        )
        self._jobs[prompt_index], self.streams[prompt_index] = job, stream
        if self._interrupted is not None:  # shut down while this one was opening
            stream.interrupt(self._interrupted)
