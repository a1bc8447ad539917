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
_Part = one worker stream + the choices its samples are (by sample index)
deltas(): one part -> its deltas; several (prompts, or a split resume) -> merged
worker fails -> _resume(part): a part per open choice, on other workers
```
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
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
        self.num_migrations = 0
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
        # Per choice, every token its workers generated: what a resume continues after.
        self._generated: list[list[int]] = [[] for _ in range(len(prompts) * self.n)]
        self._spawn: Callable[[_Part], None] | None = None  # runs another part's deltas

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
            _Part(job, stream, self._choices[p], p) for p, (job, stream) in
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

        async def pump(part: _Part) -> None:
            try:
                async for delta in self._part_deltas(part):
                    queue.put_nowait(delta)
            except BaseException as exc:  # handed to the consumer
                queue.put_nowait(exc)
            finally:
                queue.put_nowait(_DONE)

        def spawn(part: _Part) -> None:
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

    async def _part_deltas(self, part: _Part) -> AsyncIterator[TextDelta]:
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
                            self._generated[choice.index].extend(output.token_ids)
                            self._count(choice.num_tokens - num_tokens)
                            if delta is not None:
                                yield delta
                        if all(c.is_finished for c in part.choices):
                            break
                return
            except WorkerFailedError as exc:
                if not self._may_resume():
                    raise
                resumed = await self._resume(part, exc)
                if not resumed:
                    for delta in self._finished_by_length(part):
                        yield delta
                    return
                for delta in self._finished_by_length(part):
                    yield delta
                part = resumed[0]
                for other in resumed[1:]:
                    assert self._spawn is not None, "n > 1 runs in the merging path"
                    self._spawn(other)

    def _count(self, num_tokens: int) -> None:
        if num_tokens:
            self.usage.completion_tokens += num_tokens
            self._metrics.generation_tokens.inc(num_tokens)

    def _finished_by_length(self, part: _Part) -> list[TextDelta]:
        """Choices whose every token was sent: only the finish was lost with the worker."""
        deltas = []
        for choice in part.choices:
            if not choice.is_finished and self._is_complete(part, choice):
                delta = choice.push(wpb.SampleOutput(finish_reason=wpb.FINISH_REASON_LENGTH))
                if delta is not None:
                    deltas.append(delta)
        return deltas

    def _is_complete(self, part: _Part, choice: ChoiceText) -> bool:
        return len(self._generated[choice.index]) >= part.job.params.max_tokens

    def _may_resume(self) -> bool:
        return self._interrupted is None and self.num_migrations < self._dispatcher.migration_limit

    async def _resume(self, part: _Part, error: WorkerFailedError) -> list[_Part]:
        """Each open choice of a failed part again, on another worker, continuing after
        its own tokens (sample i of a seeded request of n keeps its seed + i)."""
        pending = [
            (i, c) for i, c in enumerate(part.choices)
            if not c.is_finished and not self._is_complete(part, c)
        ]  # fmt: skip
        if not pending:
            return []
        self.num_migrations += 1
        self._metrics.migrations.inc()
        self._metrics.failovers.labels(error.reason).inc()
        logger.warning(
            "request %s: %s; resuming %d choice(s) elsewhere after %s tokens",
            self.request_id, error, len(pending),
            "/".join(str(len(self._generated[c.index])) for _, c in pending),
        )  # fmt: skip
        failed = part.stream.handle.address
        opened = [
            self._dispatcher.resume(part.one_sample(i), self._generated[c.index], failed)
            for i, c in pending
        ]
        results = await asyncio.gather(*opened, return_exceptions=True)
        streams = [r for r in results if isinstance(r, tuple)]
        error_ = next((r for r in results if isinstance(r, BaseException)), None)
        if error_ is not None:  # one could not move: none goes on
            for _, stream in streams:
                stream.close()
            raise error_
        parts = []
        for (_, choice), (job, stream) in zip(pending, streams):
            self.streams.append(stream)
            self.usage.resumed_prefill_tokens += len(job.prompt_token_ids) + len(
                job.output_token_ids
            )
            self.usage.resumed_cached_tokens += stream.num_cached_tokens
            self._metrics.cached_tokens.inc(stream.num_cached_tokens)
            if self._interrupted is not None:  # shut down while this one was opening
                stream.interrupt(self._interrupted)
            parts.append(_Part(job, stream, [choice], part.prompt_index))
        return parts


@dataclass
class _Part:
    """One worker stream of a prompt, and the choice each of its samples is."""

    job: WorkerJob
    stream: WorkerStream
    choices: list[ChoiceText]  # by the stream's sample index
    prompt_index: int

    def one_sample(self, index: int) -> WorkerJob:
        """This part's job for its sample `index` alone (n = 1, its own seed)."""
        params = type(self.job.params)()
        params.CopyFrom(self.job.params)
        if len(self.choices) == 1:
            return dataclasses.replace(self.job, params=params)
        params.n = 1
        if params.HasField("seed"):
            params.seed += index  # the worker's rule: sample i of n uses seed + i
        return dataclasses.replace(
            self.job, request_id=f"{self.job.request_id}#{index}", params=params
        )


async def _cancel(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
