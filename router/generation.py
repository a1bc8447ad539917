"""One client request from token ids to text deltas, shared by the HTTP and gRPC fronts.

```
prompts (token ids) ──► Dispatcher.open() per prompt, concurrently ──► WorkerStream
WorkerStream responses ──► ChoiceText per sample (detokenize, stop strings) ──► TextDelta
```

Choice i of prompt p has index p * n + i, as OpenAI numbers them. The
request is over when every choice has finished: a stop string may finish
one before its worker does, and once all have, the worker call is cancelled.

A worker that fails after tokens have streamed (dies, hangs, turns UNAVAILABLE)
does not end the stream: each choice it left open is resumed on another worker
with that choice's own tokens (Dispatcher.resume; one request of n = 1 per
choice, sample i of a seeded request keeping its seed + i, as the worker seeds
it), up to `--migration-limit` failovers per request, and the responses
continue the same choices (detokenizer, stop-string and logprob state live in
the ChoiceText, not on a worker). A stream that does end early ends each
unfinished choice with finish_reason "abort", then the error.

```
Part = one worker stream + the choices its samples are (by sample index)
deltas(): one part -> its deltas; several (prompts, or a split resume) -> merged
worker fails -> Failover.resume(part): a part per open choice, on other workers
```

The failover state (each choice's tokens so far, the count of moves) and the
moves themselves are router/failover.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from router.failover import Failover, Part
from router.metrics import RouterMetrics
from router.model import ModelContext
from router.routing.dispatcher import Dispatcher, WorkerJob
from router.routing.worker_stream import WorkerFailedError, WorkerStream
from router.text.choice_text import ChoiceText, TextDelta, TextOptions
from shared.errors import PagodaError
from shared.proto.pagoda.v1 import sampling_pb2
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb

_DONE = object()


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # After a failover: what the resumed prefills took (prompt plus the tokens so far)
    # and how much of it the new workers had cached. The client's prompt counts once.
    resumed_prefill_tokens: int = 0
    resumed_cached_tokens: int = 0

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
        # Workers of earlier attempts at a whole answer that was retried from scratch.
        self.earlier_worker_ids: list[str] = []
        # Per prompt: logprobs of positions 1.. when prompt_logprobs was asked for.
        self.prompt_logprobs: list[list[wpb.TokenLogprob]] = [[] for _ in prompts]
        # Per prompt, its n choices; the detokenizer and stop-string state of each
        # lives there, whichever worker its tokens come from.
        self._choices = [
            [ChoiceText(p * self.n + i, model.tokenizer, prompt, text) for i in range(self.n)]
            for p, prompt in enumerate(prompts)
        ]
        self._failover = Failover(dispatcher, metrics, request_id, len(prompts) * self.n)
        self._spawn: Callable[[Part], None] | None = None  # runs another part's deltas

    @property
    def worker_ids(self) -> list[str]:
        """Every worker that served the request, in order: one per prompt, then each
        one a failed stream moved to."""
        return self.earlier_worker_ids + [s.worker_id for s in self.streams]

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
        """Every choice's deltas until all have finished (one choice's in order)."""
        parts = [
            Part(job, stream, self._choices[p], p) for p, (job, stream) in
            enumerate(zip(self._jobs, self.streams))
        ]  # fmt: skip
        if len(parts) == 1 and self.n == 1:  # one choice: no resume ever splits it
            try:
                async with contextlib.aclosing(self._part_deltas(parts[0])) as deltas:
                    async for delta in deltas:
                        yield delta
            except PagodaError as exc:
                for delta in self._abort_open_choices():
                    yield delta
                raise self._interrupted or exc from None
            return
        queue: asyncio.Queue = asyncio.Queue()
        tasks: list[asyncio.Task] = []

        async def pump(part: Part) -> None:
            try:
                async for delta in self._part_deltas(part):
                    queue.put_nowait(delta)
            except BaseException as exc:  # handed to the consumer
                queue.put_nowait(exc)
            finally:
                queue.put_nowait(_DONE)

        def spawn(part: Part) -> None:
            tasks.append(asyncio.create_task(pump(part)))

        self._spawn = spawn
        for part in parts:
            spawn(part)
        try:
            finished = 0
            while finished < len(tasks):  # a resume may add tasks while this runs
                item = await queue.get()
                if item is _DONE:
                    finished += 1
                elif isinstance(item, BaseException):
                    await _cancel(tasks)
                    if isinstance(item, PagodaError):
                        for delta in self._abort_open_choices():
                            yield delta
                        raise self._interrupted or item from None
                    raise item
                else:
                    yield item
        finally:
            self._spawn = None
            await _cancel(tasks)
            self.close()

    def _abort_open_choices(self) -> list[TextDelta]:
        """A stream never ends in silence: each open choice says it was cut short."""
        deltas = []
        for choice in (c for choices in self._choices for c in choices):
            delta = choice.push(wpb.SampleOutput(finish_reason=wpb.FINISH_REASON_ABORT))
            if delta is not None:
                deltas.append(delta)
        return deltas

    async def _part_deltas(self, part: Part) -> AsyncIterator[TextDelta]:
        """One worker stream's deltas; when its worker fails, its open choices go on
        from other workers (the first here, the others in parts of their own)."""
        while True:
            try:
                async with contextlib.aclosing(part.stream.responses()) as responses:
                    async for response in responses:
                        self.prompt_logprobs[part.prompt_index].extend(response.prompt_logprobs)
                        for output in response.outputs:
                            choice = part.choices[output.index]
                            num_tokens = choice.num_tokens
                            delta = choice.push(output)
                            self._failover.generated[choice.index].extend(output.token_ids)
                            self._count(choice.num_tokens - num_tokens)
                            if delta is not None:
                                yield delta
                        if all(c.is_finished for c in part.choices):
                            break
                return
            except WorkerFailedError as exc:
                if self._interrupted is not None or not self._failover.may_resume():
                    raise
                resumed = await self._failover.resume(part, exc)
                for new_part in resumed:
                    self._adopt(new_part)
                for delta in self._failover.finished_by_length(part):
                    yield delta
                if not resumed:
                    return
                part = resumed[0]
                for other in resumed[1:]:
                    assert self._spawn is not None, "n > 1 runs in the merging path"
                    self._spawn(other)

    def _count(self, num_tokens: int) -> None:
        if num_tokens:
            self.usage.completion_tokens += num_tokens
            self._metrics.generation_tokens.inc(num_tokens)

    def _adopt(self, part: Part) -> None:
        """A part resumed on another worker joins the request's streams and usage."""
        stream = part.stream
        self.streams.append(stream)
        self.usage.resumed_prefill_tokens += len(part.job.prompt_token_ids) + len(
            part.job.output_token_ids
        )
        self.usage.resumed_cached_tokens += stream.num_cached_tokens
        if self._interrupted is not None:  # shut down while this one was opening
            stream.interrupt(self._interrupted)


async def _cancel(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
