"""Faults against real processes: `pagoda serve` with two workers (each test gets its
own, since the faults leave them changed), steady streamed traffic from real openai
clients, and the workers' pids to signal."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest

from tests.cluster import ENGINE_FLAGS
from tests.router.conftest import API_KEY, MODEL, Served, serving

# Short enough that a hang is caught within a test, long enough for a loaded machine.
STALL_TIMEOUT_S = 3.0
PROMPTS = [f"fault tolerance prompt {i}" for i in range(6)]


@dataclass
class FaultServe:
    served: Served
    pids: dict[str, int]  # worker id (as the x-pagoda-worker header names it) -> pid

    def client(self) -> openai.OpenAI:
        return self.served.client()


@contextmanager
def fault_serve(model: Path, log_path: Path, *flags: str) -> Iterator[FaultServe]:
    args = [str(model), "--num-workers=2", f"--served-model-name={MODEL}"]
    args += [f"--api-key={API_KEY}", f"--worker-stall-timeout={STALL_TIMEOUT_S}"]
    args += ["--load-interval=0.2", *ENGINE_FLAGS, *flags]
    with serving(args, log_path, 2) as served:
        started = re.findall(
            r"started worker \d+ \(pid (\d+)\) on port (\d+)", served.router.process.log()
        )
        pids = {f"{_hostname()}-{port}": int(pid) for pid, port in started}
        yield FaultServe(served, pids)


def _hostname() -> str:
    import socket

    return socket.gethostname()


@pytest.fixture
def make_fault_serve(make_checkpoint, tmp_path):
    def make(*flags: str):
        return fault_serve(make_checkpoint("llama"), tmp_path / "serve.log", *flags)

    return make


@dataclass
class StreamResult:
    prompt: str
    params: dict
    worker: str = ""
    workers: str = ""  # every worker that served it (the finish chunks' pagoda_worker)
    texts: dict[int, str] = field(default_factory=dict)  # by choice index
    num_chunks: int = 0
    finish_reason: str | None = None
    completion_tokens: int | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def text(self) -> str:
        """Every choice's text, in index order (one choice: its text)."""
        return "\n---\n".join(self.texts[i] for i in sorted(self.texts))


def run_stream(client: openai.OpenAI, result: StreamResult) -> None:
    try:
        with client.completions.with_streaming_response.create(
            model=MODEL,
            prompt=result.prompt,
            stream=True,
            stream_options={"include_usage": True},
            **result.params,
        ) as raw:
            result.worker = raw.headers["x-pagoda-worker"]
            for chunk in raw.parse():
                for choice in chunk.choices:
                    result.texts[choice.index] = result.texts.get(choice.index, "") + choice.text
                    result.num_chunks += 1
                    result.finish_reason = choice.finish_reason or result.finish_reason
                if chunk.usage is not None:
                    result.completion_tokens = chunk.usage.completion_tokens
                    result.workers = (chunk.model_extra or {}).get("pagoda_worker", "")
    except BaseException as exc:  # recorded for the test to judge
        result.error = exc
    finally:
        result.done.set()


def start_streams(client: openai.OpenAI, requests: list[tuple[str, dict]]) -> list[StreamResult]:
    results = [StreamResult(prompt, params) for prompt, params in requests]
    for result in results:
        threading.Thread(target=run_stream, args=(client, result), daemon=True).start()
    return results


def wait_all(results: list[StreamResult], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    for result in results:
        assert result.done.wait(max(deadline - time.monotonic(), 0.1)), "a stream hung"


def undisturbed(client: openai.OpenAI, requests: list[tuple[str, dict]]) -> list[StreamResult]:
    results = start_streams(client, requests)
    wait_all(results)
    assert all(r.error is None for r in results), [r.error for r in results]
    return results
