"""Per-step overhead of the worker service outside the model forward.

    PYTHONPATH=$PWD python -m bench.worker_overhead [--streams 64 --max-tokens 64]

Runs a SmolLM2-135M-shaped random checkpoint twice with the same requests:
the bare engine in a loop, and the worker service (gRPC + engine thread) fed
by `--streams` concurrent Generate streams from a client in another process.
For every decode step with all streams running it times the interval between
step starts (everything the thread does per step, and every wait for the GIL)
and the model forward inside it:

    overhead = 1 - (forward + LM head) / step interval     (median over steps)

The engine computes logits outside the model's forward(), only for the rows
that sample, so the LM head is timed on its own and reported both ways.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CHECKPOINT = REPO_ROOT / "bench" / "results" / "tmp" / "smollm2-135m-shaped"


class StepTimer:
    """Wraps engine.step, the runner's execute_model and the model's forward, and keeps
    the steady-state decode steps (every stream running, one token each)."""

    def __init__(self, engine, num_streams: int) -> None:
        import torch

        # Per step: [start, step s, execute_model s, forward s, LM head s], or None for
        # steps outside the steady state.
        self.steps: list[list[float] | None] = []
        self._current = [0.0] * 5
        is_cuda = engine.core.runner.device.type == "cuda"
        sync = torch.cuda.synchronize if is_cuda else (lambda: None)
        runner, model = engine.core.runner, engine.core.runner.model
        real_forward, real_execute, real_step = model.forward, runner.execute_model, engine.step
        real_logits = model.compute_logits

        def timed(fn, slot):
            def wrapper(*args, **kwargs):
                start = time.perf_counter()
                out = fn(*args, **kwargs)
                sync()
                self._current[slot] += time.perf_counter() - start
                return out

            return wrapper

        def timed_step():
            self._current = [time.perf_counter(), 0.0, 0.0, 0.0, 0.0]
            out = timed(real_step, 1)()
            stats = out.stats
            steady = stats.num_running == num_streams and stats.num_scheduled_tokens == num_streams
            self.steps.append(self._current if steady else None)
            return out

        model.forward = timed(real_forward, 3)
        model.compute_logits = timed(real_logits, 4)
        runner.execute_model = timed(real_execute, 2)
        engine.step = timed_step

    def summary(self) -> dict:
        """Fractions of the step interval (from one step's start to the next's), as the
        median over steady steps, so a burst of noise on a shared machine counts once."""
        rows = [
            (b[0] - a[0], a[1], a[2], a[3], a[4])
            for a, b in zip(self.steps, self.steps[1:])
            if a is not None and b is not None
        ]
        if not rows:
            return {"steady_decode_steps": 0}

        def median(values):
            values = sorted(values)
            return values[len(values) // 2]

        return {
            "steady_decode_steps": len(rows),
            "median_step_interval_ms": 1000 * median(r[0] for r in rows),
            "median_forward_ms": 1000 * median(r[3] for r in rows),
            "median_lm_head_ms": 1000 * median(r[4] for r in rows),
            # Everything but the model's compute (transformer forward + LM head):
            # sampling, input building, scheduling, and the service's own work.
            "outside_model": median(1 - (r[3] + r[4]) / r[0] for r in rows),
            # ... and the LM head too (the engine computes logits outside forward()).
            "outside_forward": median(1 - r[3] / r[0] for r in rows),
            # Everything but the runner (forward + LM head + sampling + inputs).
            "outside_runner": median(1 - r[2] / r[0] for r in rows),
            # The engine thread's time outside engine.step (commands, delivery, load).
            "outside_engine_step": median(1 - r[1] / r[0] for r in rows),
        }


def prompts(num: int, length: int, vocab: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (length,), generator=g).tolist() for _ in range(num)]


def run_bare(engine_config, requests, max_tokens: int) -> dict:
    from shared.sampling_params import SamplingParams
    from worker.engine.llm_engine import LLMEngine

    engine = LLMEngine(engine_config)
    timer = StepTimer(engine, len(requests))
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(requests):
        engine.add_request(str(i), prompt, params)
    while engine.has_unfinished_requests():
        engine.step()
    return timer.summary()


def run_service(engine_config, requests, max_tokens: int) -> dict:
    from worker.service.background import BackgroundWorker
    from worker.service.config import WorkerServiceConfig

    config = WorkerServiceConfig(host="127.0.0.1", port=0, redis_url=None)
    worker = BackgroundWorker(engine_config, config).start()
    timer = worker.on_engine(lambda engine: StepTimer(engine, len(requests)))
    client = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.worker_overhead",
            "--client",
            worker.address,
            "--max-tokens",
            str(max_tokens),
        ],
        input=json.dumps(requests),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=True,
    )
    worker.stop()
    return {**timer.summary(), **json.loads(client.stdout)}


async def client_main(address: str, max_tokens: int) -> dict:
    """The load: every prompt from stdin as one concurrent stream."""
    import grpc

    from shared.proto.pagoda.worker.v1 import worker_pb2 as pb
    from shared.proto.pagoda.worker.v1 import worker_pb2_grpc as pb_grpc

    requests = json.loads(sys.stdin.read())
    params = pb.SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.WorkerServiceStub(channel)

        async def one(prompt: list[int]) -> tuple[int, int]:
            num_tokens = num_responses = 0
            call = stub.Generate(
                pb.GenerateRequest(prompt_token_ids=prompt, sampling_params=params)
            )
            async for response in call:
                num_responses += 1
                num_tokens += sum(len(o.token_ids) for o in response.outputs)
            return num_tokens, num_responses

        start = time.perf_counter()
        results = await asyncio.gather(*(one(p) for p in requests))
    num_tokens = sum(r[0] for r in results)
    return {
        "client_tokens": num_tokens,
        "client_responses": sum(r[1] for r in results),
        "client_seconds": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--client", help=argparse.SUPPRESS)  # internal: the load process
    args = parser.parse_args()
    if args.client:
        print(json.dumps(asyncio.run(client_main(args.client, args.max_tokens))))
        return

    import torch

    from bench.checkpoints import SMOLLM2_135M_SHAPE, build_random_checkpoint
    from shared.logging import configure_logging
    from worker.config import EngineConfig

    configure_logging("WARNING")
    if not (args.checkpoint / "config.json").exists():
        build_random_checkpoint(
            args.checkpoint,
            "llama",
            dtype=torch.bfloat16,
            with_tokenizer=False,
            **SMOLLM2_135M_SHAPE,
        )
    engine_config = EngineConfig.from_kwargs(
        model=str(args.checkpoint),
        device=args.device,
        max_model_len=1024,
        kv_cache_memory=2 * 2**30,
    )
    requests = prompts(args.streams, args.prompt_len, SMOLLM2_135M_SHAPE["vocab_size"])
    # The service first: its engine thread's OpenMP team ends with the thread, while
    # the bare engine's, on the main thread, would outlive it and slow every step of
    # the service (worker/service/engine_loop.py).
    service = run_service(engine_config, requests, args.max_tokens)
    bare = run_bare(engine_config, requests, args.max_tokens)
    print(json.dumps({"streams": args.streams, "bare_engine": bare, "service": service}, indent=2))
    for name, result in (("bare engine", bare), ("service", service)):
        print(
            f"{name}: {result['median_step_interval_ms']:.1f} ms per step; outside the model "
            f"(forward + LM head) {100 * result['outside_model']:.1f}%, outside forward() "
            f"{100 * result['outside_forward']:.1f}%, outside the runner "
            f"{100 * result['outside_runner']:.1f}%, outside engine.step "
            f"{100 * result['outside_engine_step']:.1f}%"
        )


if __name__ == "__main__":
    main()
