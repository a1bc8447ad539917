"""A request's choices moving to other workers when theirs fails mid-stream.

A `Part` is one worker stream of a prompt and the choices its samples are.
`Failover` keeps what a move needs, for every choice of the request: the tokens
its workers generated so far (what a resumed request continues after) and the
request's count of moves against `--migration-limit`.

```
worker fails -> resume(part): one new part per open choice, each on another worker
               (n = 1, sample i of a seeded request of n keeping its seed + i)
             -> finished_by_length(part): choices whose every token was already
                sent; only their finish was lost with the worker
```
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

from router.metrics import RouterMetrics
from router.routing.dispatcher import Dispatcher, WorkerJob
from router.routing.worker_stream import WorkerFailedError, WorkerStream
from router.text.choice_text import ChoiceText, TextDelta
from shared.logging import get_logger
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb

logger = get_logger(__name__)


@dataclass
class Part:
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


class Failover:
    def __init__(
        self, dispatcher: Dispatcher, metrics: RouterMetrics, request_id: str, num_choices: int
    ) -> None:
        self._dispatcher = dispatcher
        self._metrics = metrics
        self._request_id = request_id
        self.num_migrations = 0
        # Per choice (by its index), every token its workers generated.
        self.generated: list[list[int]] = [[] for _ in range(num_choices)]

    def may_resume(self) -> bool:
        return self.num_migrations < self._dispatcher.migration_limit

    def finished_by_length(self, part: Part) -> list[TextDelta]:
        """Choices whose every token was sent: only the finish was lost with the worker."""
        deltas = []
        for choice in part.choices:
            if not choice.is_finished and self._is_complete(part, choice):
                delta = choice.push(wpb.SampleOutput(finish_reason=wpb.FINISH_REASON_LENGTH))
                if delta is not None:
                    deltas.append(delta)
        return deltas

    def _is_complete(self, part: Part, choice: ChoiceText) -> bool:
        return len(self.generated[choice.index]) >= part.job.params.max_tokens

    async def resume(self, part: Part, error: WorkerFailedError) -> list[Part]:
        """Each open choice of a failed part again, on another worker, continuing after
        its own tokens. Raises the first error when one cannot move (then none goes on)."""
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
            self._request_id, error, len(pending),
            "/".join(str(len(self.generated[c.index])) for _, c in pending),
        )  # fmt: skip
        failed = part.stream.handle.address
        opened = [
            self._dispatcher.resume(part.one_sample(i), self.generated[c.index], failed)
            for i, c in pending
        ]
        results = await asyncio.gather(*opened, return_exceptions=True)
        streams = [r for r in results if isinstance(r, tuple)]
        first_error = next((r for r in results if isinstance(r, BaseException)), None)
        if first_error is not None:
            for _, stream in streams:
                stream.close()
            raise first_error
        for _, stream in streams:
            self._metrics.cached_tokens.inc(stream.num_cached_tokens)
        return [
            Part(job, stream, [choice], part.prompt_index)
            for (_, choice), (job, stream) in zip(pending, streams)
        ]
