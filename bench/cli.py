"""`pagoda bench ...`: the benchmark harness's commands (docs/BENCHMARKS.md).

    offline     our engine (or --baseline hf-static) over a workload, offline
    serve       an OpenAI-compatible server under streaming load
    roofline    this machine's matmul peak and bandwidth, and the workload's bound
    checkpoint  write the SmolLM2-135M-shaped random checkpoint
    workload    write a workload's JSON
    profile     where an engine step's time goes, by category (in-process timers)
    summary     a markdown table from result lines

Each command prints one JSON line per result (summary: markdown). Modules load
when their command runs, so `pagoda bench serve` and `summary` never import torch.
"""

from __future__ import annotations

import argparse
import importlib

from bench.workloads import WORKLOADS

_WORKLOAD_HELP = f"{', '.join(WORKLOADS)}, all, or a workload JSON file."


def _add_workload_args(
    parser: argparse.ArgumentParser,
    allow_all: bool = True,
    many: bool = False,
    required: bool = True,
) -> None:
    parser.add_argument(
        "--workload",
        required=required,
        nargs="+" if many else None,
        help=(_WORKLOAD_HELP if allow_all else _WORKLOAD_HELP[:-1])
        + (" One or more." if many else ""),
    )
    parser.add_argument("--seed", type=int, default=0, help="Workload seed.")
    parser.add_argument(
        "--num-requests", type=int, default=None, help="Run only the first N requests (a cut)."
    )


def _add_offline(parser: argparse.ArgumentParser) -> None:
    from shared.cli_args import add_dataclass_args
    from worker.config import EngineConfig, ModelConfig

    _add_workload_args(parser)
    parser.add_argument(
        "--baseline",
        choices=("hf-static",),
        default=None,
        help="Run plain transformers generate in static batches instead of our engine.",
    )
    parser.add_argument(
        "--batch", type=int, nargs="+", default=[16], help="Baseline batch size(s), e.g. 1 16."
    )
    parser.add_argument("--output", default=None, help="Append the JSON lines to this file.")
    # Every engine flag, --model among them; --seed is the workload's (greedy: no
    # request samples, so the engine's default seed does not matter).
    for group in EngineConfig.group_classes():
        add_dataclass_args(parser, group, skip=("seed",) if group is ModelConfig else ())


def _add_serve(parser: argparse.ArgumentParser) -> None:
    _add_workload_args(parser, allow_all=False)
    parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000")
    load = parser.add_mutually_exclusive_group(required=True)
    load.add_argument("--concurrency", type=int, help="Requests in flight at once.")
    load.add_argument("--request-rate", type=float, help="Poisson arrivals per second.")
    parser.add_argument("--model", default=None, help="Model name (default: first of /v1/models).")
    parser.add_argument("--api-key", default=None, help="Bearer token, if the server wants one.")
    parser.add_argument(
        "--vocab-size", type=int, default=None, help="For named workloads (default: SmolLM2's)."
    )
    parser.add_argument("--engine", default=None, help="Label for the result line.")
    parser.add_argument("--timeout", type=float, default=600.0, help="Per-request timeout, s.")
    parser.add_argument(
        "--stream-interval",
        type=int,
        default=None,
        help="Tokens per streamed chunk, asked in every request (vLLM's stream_interval; "
        "default: the server's own).",
    )
    parser.add_argument("--output", default=None, help="Append the JSON line to this file.")


def _add_roofline(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default=None, help="Checkpoint folder or Hub id (not with --memory-only)."
    )
    _add_workload_args(parser, many=True, required=False)
    parser.add_argument("--result", default=None, help="Offline result JSONL to rate.")
    parser.add_argument(
        "--memory-only",
        action="store_true",
        help="Only the memory bandwidth, as a `read_probe` line (run_all.sh takes one "
        "next to each one-stream served pass).",
    )
    parser.add_argument("--matmul-size", type=int, default=2048, help="Square matmul side.")
    parser.add_argument("--repeats", type=int, default=5, help="Best of this many timings.")
    parser.add_argument("--output", default=None, help="Append the JSON lines to this file.")


def _add_checkpoint(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="Folder to write the checkpoint to.")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--seed", type=int, default=0, help="Weight seed.")


def _add_workload(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=WORKLOADS)
    parser.add_argument("--out", required=True, help="JSON file to write.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=None, help="Default: SmolLM2's.")
    parser.add_argument(
        "--num-requests", type=int, default=None, help="Keep only the first N (named NAME[:N])."
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="Cap every request's max_tokens (a smoke test).",
    )


def _add_profile(parser: argparse.ArgumentParser) -> None:
    from shared.cli_args import add_dataclass_args
    from worker.config import EngineConfig, ModelConfig

    _add_workload_args(parser, allow_all=False)
    parser.add_argument(
        "--torch-profiler", type=int, default=0, metavar="N",
        help="Also print torch.profiler's top operators over the first N requests.",
    )  # fmt: skip
    parser.add_argument(
        "--clock", choices=("wall", "thread"), default="wall",
        help="wall: wall time, the engine's threads; thread: one engine thread, its CPU "
        "time (for a loaded machine).",
    )  # fmt: skip
    parser.add_argument("--output", default=None, help="Append the JSON line to this file.")
    for group in EngineConfig.group_classes():
        add_dataclass_args(parser, group, skip=("seed",) if group is ModelConfig else ())


def _add_summary(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", help="Result JSONL files.")


# name -> (argument builder, module whose main(args) runs it, help)
COMMANDS = {
    "offline": (_add_offline, "bench.offline", "Our engine (or a baseline) over a workload."),
    "serve": (_add_serve, "bench.serve_client", "Drive an OpenAI-compatible server."),
    "roofline": (_add_roofline, "bench.roofline", "Machine peak and the workload's bound."),
    "checkpoint": (_add_checkpoint, "bench.cli", "Write the SmolLM2-135M-shaped checkpoint."),
    "workload": (_add_workload, "bench.cli", "Write a workload's JSON file."),
    "profile": (_add_profile, "bench.step_profile", "Where a step's time goes (in-process)."),
    "summary": (_add_summary, "bench.report", "Markdown table from result lines."),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_command", required=True, metavar="BENCH_COMMAND")
    for name, (add, _, help_text) in COMMANDS.items():
        add(sub.add_parser(name, help=help_text, description=help_text))


def run(args: argparse.Namespace) -> int:
    command = args.bench_command
    if command == "checkpoint":
        return write_checkpoint(args)
    if command == "workload":
        return write_workload(args)
    return int(importlib.import_module(COMMANDS[command][1]).main(args) or 0)


def write_checkpoint(args: argparse.Namespace) -> int:
    import torch

    from bench.checkpoints import SMOLLM2_135M_SHAPE, build_random_checkpoint

    # bf16 weights at the real model's scale (its initializer_range), as the issue's
    # figures were measured with.
    path = build_random_checkpoint(
        args.out,
        "llama",
        seed=args.seed,
        dtype=getattr(torch, args.dtype),
        initializer_range=0.02,
        **SMOLLM2_135M_SHAPE,
    )
    print(path)
    return 0


def write_workload(args: argparse.Namespace) -> int:
    from bench.workloads import DEFAULT_VOCAB_SIZE, make_workload

    workload = make_workload(args.name, args.seed, args.vocab_size or DEFAULT_VOCAB_SIZE)
    if args.num_requests:
        workload = workload.head(args.num_requests)
    if args.max_tokens:
        workload = workload.capped(args.max_tokens)
    workload.save(args.out)
    print(args.out)
    return 0
