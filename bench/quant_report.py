"""Quantization figures on one random checkpoint, every method in one process:

    python -m bench.quant_report --out DIR [--model DENSE_DIR] [--reps 3] [--batch 1 32]

Per method: weight bytes as the engine holds them (the start-up budget line's
figure), greedy agreement with the dense engine over the prompts (tokens
equal up to the first difference, as a share of all generated), the logit
error of `transformers` on the method's dequantized weights against the dense
weights (the engine's greedy output equals transformers on those weights
token for token: tests/worker/test_exactness_quantized.py), and decode
throughput at each batch size, the methods interleaved rep by rep so a
drifting host drifts for all alike. Without --model it builds a
SmolLM2-135M-shaped random bf16 checkpoint. Writes DIR/quant_report.json and
prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from bench.checkpoints import SMOLLM2_135M_SHAPE, build_random_checkpoint
from bench.machine import describe_machine
from bench.quantized_checkpoints import write_quantized_checkpoint

# name -> (format for write_quantized_checkpoint, its options, --quantization)
METHODS = {
    "dense": (None, {}, None),
    "gptq-int4-g64": ("gptq", dict(bits=4, group_size=64), None),
    "gptq-int8": ("gptq", dict(bits=8, group_size=-1), None),
    "awq-int4-g64": ("awq", dict(group_size=64), None),
    "fp8": ("fp8", {}, None),
    "int8-at-load": ("int8", {}, "int8"),
    "int4-at-load": ("int4", {}, "int4"),
    "nf4-at-load": ("bitsandbytes", {}, "bitsandbytes"),
}
PROMPT_LEN, NEW_TOKENS, NUM_PROMPTS = 16, 32, 8


def prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (PROMPT_LEN,), generator=gen).tolist() for _ in range(n)]


@torch.no_grad()
def logit_error(dense: Path, twin: Path, batch: list[list[int]]) -> tuple[float, float]:
    from transformers import AutoModelForCausalLM

    ids = torch.tensor(batch)
    ref = AutoModelForCausalLM.from_pretrained(dense, dtype=torch.float32)(ids).logits
    got = AutoModelForCausalLM.from_pretrained(twin, dtype=torch.float32)(ids).logits
    diff = (got - ref).abs()
    return diff.mean().item(), diff.max().item()


def agreement(got: list[list[int]], ref: list[list[int]]) -> float:
    same = 0
    for a, b in zip(got, ref, strict=True):
        for x, y in zip(a, b, strict=True):
            if x != y:
                break
            same += 1
    return same / sum(len(r) for r in ref)


def main() -> None:
    from worker import LLM, SamplingParams

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default=None, help="Dense checkpoint (default: build one).")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="Engines on one thread, decode timed by its CPU time (time.thread_time): on a "
        "host other processes load, time spent descheduled does not count.",
    )
    args = parser.parse_args()
    clock = time.thread_time if args.cpu_time else time.perf_counter
    threads = {"cpu_threads": 1} if args.cpu_time else {}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dense = Path(args.model) if args.model else out / "dense"
    if not args.model and not (dense / "config.json").exists():
        build_random_checkpoint(dense, "llama", dtype=torch.bfloat16, **SMOLLM2_135M_SHAPE)
    vocab = json.loads((dense / "config.json").read_text())["vocab_size"]
    greedy = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    quality_prompts = prompts(NUM_PROMPTS, vocab)
    engines, rows, tokens = {}, {}, {}
    for name in args.methods:
        fmt, options, flag = METHODS[name]
        path, twin = dense, dense
        if fmt is not None:
            path, twin = write_quantized_checkpoint(dense, out / name, fmt, **options)
            path = dense if flag else path
        llm = LLM(str(path), quantization=flag, num_kv_blocks=2048, max_model_len=256, **threads)
        engines[name] = llm
        tokens[name] = [o.outputs[0].token_ids for o in llm.generate(quality_prompts, greedy)]
        mean_err, max_err = (
            (0.0, 0.0) if twin == dense else logit_error(dense, twin, quality_prompts)
        )
        rows[name] = {
            "weights_bytes": llm.engine.core.runner.weights_bytes,
            "greedy_agreement": agreement(tokens[name], tokens.get("dense", tokens[name])),
            "logit_mean_abs_err": mean_err,
            "logit_max_abs_err": max_err,
            "decode_s": {b: [] for b in args.batch},
        }
    for batch in args.batch:
        work = prompts(batch, vocab, seed=batch)
        for _ in range(args.reps):
            for name, llm in engines.items():
                start = clock()
                llm.generate(work, greedy)
                rows[name]["decode_s"][batch].append(clock() - start)
    report = {"machine": describe_machine(), "prompt_len": PROMPT_LEN, "new_tokens": NEW_TOKENS}
    report["timing"] = "thread CPU time, 1 thread" if args.cpu_time else "wall clock"
    report["methods"] = rows
    (out / "quant_report.json").write_text(json.dumps(report, indent=2, default=str))
    base = rows["dense"]
    header = "| method | weights MiB | vs dense | greedy agreement | logit mean/max abs err |"
    header += "".join(f" tok/s @{b} | vs dense |" for b in args.batch)
    print(header)
    print("|" + "---|" * (5 + 2 * len(args.batch)))
    for name, row in rows.items():
        line = (
            f"| {name} | {row['weights_bytes'] / 2**20:.1f} | "
            f"{row['weights_bytes'] / base['weights_bytes']:.2f} | {row['greedy_agreement']:.2f} | "
            f"{row['logit_mean_abs_err']:.4f} / {row['logit_max_abs_err']:.4f} |"
        )
        for b in args.batch:
            tps = b * NEW_TOKENS / statistics.median(row["decode_s"][b])
            base_tps = b * NEW_TOKENS / statistics.median(base["decode_s"][b])
            line += f" {tps:.1f} | {tps / base_tps:.2f} |"
        print(line)


if __name__ == "__main__":
    main()
