"""Route a request to a worker and open its Generate stream, retrying elsewhere
while nothing has been returned yet.

```
open(job)
  prompt block hashes (per worker block size)
  store.match(...)  -- one round trip: deepest prefix each worker holds
  policy.choose(...) -> worker;  store.record(choice)  (not awaited)
  Generate(...) -> wait for the first response
     fails (UNAVAILABLE, RESOURCE_EXHAUSTED, INTERNAL) -> next worker, up to --max-attempts
  -> WorkerStream (the first response and the rest)
```

A failure after the first response raises WorkerFailedError from the stream;
Generation then resumes the request with `resume()`: the same request to another
worker, with the tokens generated so far as its output_token_ids (the worker
continues after them exactly, seeded draws included).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field

import grpc

from router.config import RouterConfig
from router.metrics import RouterMetrics
from router.routing import policy
from router.routing.store import AffinityStore, PromptHashes, StoreUnavailable
from router.routing.worker_handle import WorkerHandle
from router.routing.worker_pool import WorkerPool
from router.routing.worker_stream import WorkerStream, error_from_rpc
from shared.block_hash import extend_block_hashes
from shared.errors import UnavailableError
from shared.logging import get_logger
from shared.proto.pagoda.v1 import sampling_pb2
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb

logger = get_logger(__name__)

# Worker failures that another worker may not have.
_RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.ABORTED,
    }
)


@dataclass
class WorkerJob:
    """One prompt's request to one worker."""

    request_id: str
    prompt_token_ids: list[int]
    params: sampling_pb2.SamplingParams
    cache_salt: bytes | None = None
    arrival: float = field(default_factory=time.monotonic)
    priority: int = 0  # the worker's --scheduling-policy priority; lower runs first
    # Tokens a failed worker generated already (a resumed request; n = 1).
    output_token_ids: list[int] = field(default_factory=list)
    timeout: float | None = None  # --request-timeout, from arrival


class Dispatcher:
    def __init__(
        self, config: RouterConfig, pool: WorkerPool, store: AffinityStore, metrics: RouterMetrics
    ) -> None:
        self._config = config
        self._pool = pool
        self._store = store
        self._metrics = metrics
        self._choice_ttl = config.effective_choice_ttl
        self.migration_limit = config.migration_limit
        self.request_timeout = config.request_timeout
        self._background: set[asyncio.Task] = set()
        # Open generations (router/generation.py), ended at shutdown.
        self.generations: weakref.WeakSet = weakref.WeakSet()

    async def resume(
        self, job: WorkerJob, output_token_ids: list[int], failed_address: str
    ) -> tuple[WorkerJob, WorkerStream]:
        """The job again, on another worker, continuing after `output_token_ids`."""
        params = type(job.params)()
        params.CopyFrom(job.params)
        params.ClearField("prompt_logprobs")  # the client has them already
        resumed = dataclasses.replace(job, params=params, output_token_ids=list(output_token_ids))
        return resumed, await self.open(resumed, exclude=[failed_address])

    async def open(self, job: WorkerJob, exclude: Iterable[str] = ()) -> WorkerStream:
        # Routed by every token the worker will hold: a resumed job's outputs too.
        tokens = job.prompt_token_ids + job.output_token_ids
        prompt = PromptHashes(tokens, job.cache_salt)
        request = wpb.GenerateRequest(
            request_id=job.request_id,
            prompt_token_ids=job.prompt_token_ids,
            sampling_params=job.params,
            priority=job.priority,
            output_token_ids=job.output_token_ids,
        )
        if job.cache_salt is not None:
            request.cache_salt = job.cache_salt
        excluded: set[str] = set(exclude)
        last_error: Exception | None = None
        for attempt in range(self._config.max_attempts):
            handle, decision = await self._route(prompt, excluded)
            if handle is None:
                break
            if attempt:
                self._metrics.retries.inc()
            self.record(handle, prompt.chain(handle.key.block_size))
            uncached = max(len(tokens) - decision.num_matched_tokens, 1)
            stream = WorkerStream(handle, decision, job, uncached, self._metrics, self._on_end)
            stream.prompt_hashes = prompt
            try:
                await stream.start(request)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and job.timeout is not None:
                    raise stream.timed_out_error() from exc
                if exc.code() not in _RETRYABLE:
                    raise error_from_rpc(exc) from exc
                logger.warning(
                    "request %s: worker %s failed before its first token (%s: %s); %s",
                    job.request_id,
                    handle.worker_id,
                    exc.code().name,
                    exc.details(),
                    "retrying elsewhere"
                    if attempt + 1 < self._config.max_attempts
                    else "giving up",
                )
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    handle.mark_failed()
                excluded.add(handle.address)
                last_error = error_from_rpc(exc)
                continue
            return stream
        if last_error is not None:
            raise UnavailableError(
                f"no worker could take the request ({len(excluded)} tried); last error: {last_error}"
            )
        raise UnavailableError("no worker is serving the model right now; retry shortly")

    async def _route(
        self, prompt: PromptHashes, excluded: set[str]
    ) -> tuple[WorkerHandle | None, policy.Decision]:
        handles = [h for h in self._pool.serving() if h.address not in excluded]
        if not handles:
            return None, policy.Decision("", policy.MISS, 0, 0)
        by_id = {h.worker_id: h for h in handles}
        fallback = policy.LOAD if self._config.routing_policy == "load" else None
        matched: dict[str, int] = {}
        if fallback is None:
            try:
                matched = await self._store.match([h.key for h in handles], prompt)
            except StoreUnavailable:
                fallback = policy.NO_STORE
        candidates = [
            policy.Candidate(
                h.worker_id,
                num_matched_tokens=matched.get(h.worker_id, 0) * h.key.block_size,
                num_queued_tokens=h.load.num_queued_tokens,
                num_running=h.load.num_running,
                num_sent=h.num_sent,
            )
            for h in handles
        ]
        decision = policy.choose(
            candidates, len(prompt.token_ids), fallback, self._config.affinity_threshold
        )
        self._metrics.routing_decisions.labels(decision.reason).inc()
        return by_id[decision.worker_id], decision

    def record(self, handle: WorkerHandle, hashes: list[bytes]) -> None:
        """Record a choice without waiting: a lost record only costs a cache miss."""
        if not hashes or self._config.routing_policy == "load":
            return
        task = asyncio.create_task(self._store.record(handle.key, hashes, self._choice_ttl))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _on_end(self, stream: WorkerStream) -> None:
        """A stream ended well: the worker now also holds the blocks it generated."""
        if stream.output_token_ids and stream.prompt_hashes is not None:
            job, block_size = stream.job, stream.handle.key.block_size
            hashes = extend_block_hashes(
                list(stream.prompt_hashes.chain(block_size)),
                job.prompt_token_ids + job.output_token_ids + stream.output_token_ids,
                block_size,
                job.cache_salt,
            )
            self.record(stream.handle, hashes)
