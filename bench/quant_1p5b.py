"""Quantization figures on a Qwen2.5-1.5B-shaped random bf16 model, one method at a time:

    python -m bench.quant_1p5b --out DIR [--model DIR] [--methods dense int8 ...]
        [--reps 1] [--new-tokens 16] [--mixed-requests 8]

A 1.5B model per method does not fit beside others in memory on a small host,
so each method's engine is built, measured and dropped before the next
(bench/quant_report.py keeps every engine and interleaves them: better on a
quiet machine for the small model). The checkpoint is written tensor by tensor
(random normal weights, std 0.02, bf16, tied embeddings, no float32 copy of the
model in memory), with a byte-level BPE tokenizer of the full vocabulary so
llama.cpp's converter can read it too (bench/llamacpp_compare.py).

Per method: weight bytes as the loaded engine holds them; decode at batch 1
and 32 (16-token prompts, --new-tokens greedy tokens each, ignore_eos) and a
`mixed` workload cut to --mixed-requests requests (bench/workloads.py: prompts
16-256, outputs 16-128 tokens), all timed by the engine thread's CPU time on
one thread (time.thread_time: on a loaded host, time spent descheduled does not
count); quality: the engine's own logits at the last position of 32 prompt
prefixes against the dense engine's (mean and max abs error) and greedy
agreement (tokens equal up to the first difference, as a share) over 8 prompts.
Writes DIR/quant_1p5b.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

import torch

from bench.machine import describe_machine
from bench.quant_report import agreement
from bench.workloads import TokenDraw, mixed

QWEN25_15B_SHAPE = dict(
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
# name -> (--quantization, --kv-cache-dtype)
METHODS = {
    "dense": (None, "auto"),
    "int8": ("int8", "auto"),
    "int4": ("int4", "auto"),
    "fp8": ("fp8", "auto"),
    "dense+fp8-kv": (None, "fp8"),
}
PROMPT_LEN = 16


def build_streamed_checkpoint(path: Path, seed: int = 0, std: float = 0.02) -> Path:
    """A random Qwen2 checkpoint of QWEN25_15B_SHAPE, one safetensors shard per layer."""
    import transformers
    from safetensors.torch import save_file

    from bench.checkpoints import build_tokenizer

    if (path / "model.safetensors.index.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    shape = QWEN25_15B_SHAPE
    config = transformers.Qwen2Config(
        **shape, torch_dtype="bfloat16", bos_token_id=0, eos_token_id=1
    )
    config.architectures = ["Qwen2ForCausalLM"]
    config.save_pretrained(str(path))
    gen = torch.Generator().manual_seed(seed)
    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    kv = shape["num_key_value_heads"] * hidden // shape["num_attention_heads"]

    def randn(*size):
        return (torch.randn(size, generator=gen) * std).to(torch.bfloat16)

    weight_map: dict[str, str] = {}

    def shard(name: str, tensors: dict[str, torch.Tensor]) -> None:
        save_file(tensors, str(path / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))

    shard(
        "embed.safetensors",
        {
            "model.embed_tokens.weight": randn(shape["vocab_size"], hidden),
            "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        },
    )
    for i in range(shape["num_hidden_layers"]):
        p = f"model.layers.{i}"
        shard(
            f"layer{i:02d}.safetensors",
            {
                f"{p}.input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
                f"{p}.post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
                f"{p}.self_attn.q_proj.weight": randn(hidden, hidden),
                f"{p}.self_attn.q_proj.bias": randn(hidden),
                f"{p}.self_attn.k_proj.weight": randn(kv, hidden),
                f"{p}.self_attn.k_proj.bias": randn(kv),
                f"{p}.self_attn.v_proj.weight": randn(kv, hidden),
                f"{p}.self_attn.v_proj.bias": randn(kv),
                f"{p}.self_attn.o_proj.weight": randn(hidden, hidden),
                f"{p}.mlp.gate_proj.weight": randn(inter, hidden),
                f"{p}.mlp.up_proj.weight": randn(inter, hidden),
                f"{p}.mlp.down_proj.weight": randn(hidden, inter),
            },
        )
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1)
    )
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    build_tokenizer(path, shape["vocab_size"])
    return path


def _prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (PROMPT_LEN,), generator=gen).tolist() for _ in range(n)]


def _last_logits(llm, prompts) -> torch.Tensor:
    """The engine's float logits at each prompt's last position: [len(prompts), vocab]."""
    from worker import SamplingParams

    model = llm.engine.core.runner.model
    captured: list[torch.Tensor] = []
    compute = model.compute_logits

    def capture(hidden):
        logits = compute(hidden)
        captured.append(logits.float().clone())
        return logits

    model.compute_logits = capture
    try:
        for p in prompts:  # one at a time: one row of logits each
            llm.generate([p], SamplingParams(temperature=0, max_tokens=1), detokenize=False)
    finally:
        del model.compute_logits
    return torch.cat([c[-1:] for c in captured])


def wait_for_memory(gib: float, timeout_s: float = 1800.0) -> float:
    """Block until MemAvailable reaches `gib` GiB (a shared host: a 1.5B engine
    started into too little memory gets someone's process OOM-killed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) / 2**20
        if available >= gib or time.monotonic() > deadline:
            return available
        time.sleep(10)


def measure(path: Path, name: str, args, vocab: int) -> dict:
    from worker import LLM, SamplingParams

    available = wait_for_memory(args.wait_mem_gib)
    print(f"{name}: starting with {available:.1f} GiB available", flush=True)

    flag, kv_dtype = METHODS[name]
    llm = LLM(
        str(path),
        quantization=flag,
        kv_cache_dtype=kv_dtype,
        max_model_len=512,
        num_kv_blocks=256,
        cpu_threads=1,
    )
    row = {"weights_bytes": llm.engine.core.runner.weights_bytes}
    greedy = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
    quality = _prompts(8, vocab, seed=0)
    row["tokens"] = [
        o.outputs[0].token_ids for o in llm.generate(quality, greedy, detokenize=False)
    ]
    prefixes = [p[:n] for p in quality for n in (4, 8, 12, 16)]
    row["logits"] = _last_logits(llm, prefixes)
    if args.quality_only:
        llm.shutdown()
        return row
    for batch in (1, 32):
        work = _prompts(batch, vocab, seed=batch)
        times = []
        for _ in range(args.reps):
            start = time.thread_time()
            llm.generate(work, greedy, detokenize=False)
            times.append(time.thread_time() - start)
        row[f"decode_b{batch}_tok_s"] = batch * args.new_tokens / statistics.median(times)
    requests = mixed(TokenDraw(0, vocab, stream="mixed"), num_requests=args.mixed_requests)
    mixed_prompts = [list(r.prompt_token_ids) for r in requests]
    params = [
        SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True) for r in requests
    ]
    total = sum(len(r.prompt_token_ids) + r.max_tokens for r in requests)
    times = []
    for _ in range(args.reps):
        start = time.thread_time()
        llm.generate(mixed_prompts, params, detokenize=False)
        times.append(time.thread_time() - start)
    row["mixed_total_tok_s"] = total / statistics.median(times)
    row["mixed_tokens"] = total
    llm.shutdown()
    del llm
    gc.collect()
    return row


def truncated_checkpoint(path: Path, depth: int, out: Path) -> Path:
    """The checkpoint's first `depth` layers (shards linked, not copied)."""
    if depth == QWEN25_15B_SHAPE["num_hidden_layers"]:
        return path
    out.mkdir(parents=True, exist_ok=True)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    keep = {
        name: file
        for name, file in index["weight_map"].items()
        if not name.startswith("model.layers.") or int(name.split(".")[2]) < depth
    }
    for file in set(keep.values()):
        if not (out / file).exists():
            (out / file).symlink_to(path / file)
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": keep}))
    for item in path.iterdir():
        if item.suffix == ".json" and item.name != "model.safetensors.index.json":
            (out / item.name).write_bytes(item.read_bytes())
    for item in path.glob("tokenizer*"):
        (out / item.name).write_bytes(item.read_bytes())
    config = json.loads((out / "config.json").read_text())
    config["num_hidden_layers"] = depth
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def extrapolate(low: dict, high: dict, depths: list[int], full: int) -> dict:
    """Bytes and per-token CPU seconds are (fixed part) + layers x (per-layer part):
    the two depths give both, and the sum at `full` layers."""
    factor = (full - depths[0]) / (depths[1] - depths[0])
    row = {
        "full_weights_bytes": low["weights_bytes"]
        + (high["weights_bytes"] - low["weights_bytes"]) * factor
    }
    for key in ("decode_b1_tok_s", "decode_b32_tok_s", "mixed_total_tok_s"):
        s_low, s_high = 1 / low[key], 1 / high[key]
        row[f"full_{key}"] = 1 / (s_low + (s_high - s_low) * factor)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--model", default=None, help="Checkpoint folder (default: DIR/qwen25-1.5b)."
    )
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--mixed-requests", type=int, default=8)
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--quality-only", action="store_true", help="Bytes and logits, no timing.")
    parser.add_argument(
        "--layers",
        type=int,
        nargs="+",
        default=None,
        help="Measure at these depths (the checkpoint's first N layers); two depths: "
        "per-layer cost and bytes by difference, extrapolated to 28 layers.",
    )
    parser.add_argument(
        "--wait-mem-gib",
        type=float,
        default=0.0,
        help="Start each engine only with this much free.",
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = build_streamed_checkpoint(Path(args.model) if args.model else out / "qwen25-1.5b")
    if args.build_only:
        return
    vocab = QWEN25_15B_SHAPE["vocab_size"]
    depths = args.layers or [QWEN25_15B_SHAPE["num_hidden_layers"]]
    by_depth: dict[int, dict] = {}
    for depth in depths:
        model = truncated_checkpoint(path, depth, out / f"layers{depth}")
        by_depth[depth] = {}
        for name in args.methods:
            row = measure(model, name, args, vocab)
            by_depth[depth][name] = row
            shown = {k: v for k, v in row.items() if k not in ("tokens", "logits")}
            print(depth, name, shown, flush=True)
    rows = by_depth[depths[-1]]
    if len(depths) == 2:
        full = QWEN25_15B_SHAPE["num_hidden_layers"]
        for name, row in rows.items():
            row.update(extrapolate(by_depth[depths[0]][name], row, depths, full))
    base = rows.get("dense")
    for row in rows.values():
        if base is not None:
            diff = (row["logits"] - base["logits"]).abs()
            row["logit_mean_abs_err"], row["logit_max_abs_err"] = (
                diff.mean().item(),
                diff.max().item(),
            )
            row["greedy_agreement"] = agreement(row["tokens"], base["tokens"])
    for row in rows.values():
        del row["logits"]
    report = {
        "machine": describe_machine(),
        "shape": QWEN25_15B_SHAPE,
        "timing": "engine thread CPU time, 1 thread",
        "args": vars(args),
        "methods": rows,
        "by_depth": {
            d: {
                m: {k: v for k, v in r.items() if k not in ("tokens", "logits")}
                for m, r in rs.items()
            }
            for d, rs in by_depth.items()
        },
    }
    (out / "quant_1p5b.json").write_text(json.dumps(report, indent=2, default=str))
    print(
        "| method | weights MiB | vs dense | logit mean / max abs err | greedy agreement |"
        " decode tok/s @1 | vs dense | @32 | vs dense | mixed tok/s | vs dense |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        ref = base or row
        cells = [
            name,
            f"{row['weights_bytes'] / 2**20:.0f}",
            f"{row['weights_bytes'] / ref['weights_bytes']:.2f}",
            f"{row.get('logit_mean_abs_err', 0):.3f} / {row.get('logit_max_abs_err', 0):.3f}",
            f"{row.get('greedy_agreement', 1):.2f}",
        ]
        for key in ("decode_b1_tok_s", "decode_b32_tok_s", "mixed_total_tok_s"):
            if key in row:
                cells += [f"{row[key]:.2f}", f"{row[key] / ref[key]:.2f}"]
        if "full_weights_bytes" in row:
            cells.append(f"28 layers: {row['full_weights_bytes'] / 2**20:.0f} MiB")
            for key in ("decode_b1_tok_s", "decode_b32_tok_s", "mixed_total_tok_s"):
                full = row[f"full_{key}"]
                cells.append(f"{full:.2f} ({full / ref[f'full_{key}']:.2f}x)")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
