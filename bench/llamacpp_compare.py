"""Batch-1 decode: llama.cpp Q4_0 / Q8_0 against Pagoda int4 / int8 on one checkpoint.

    python -m bench.llamacpp_compare --llama-cpp /path/to/llama.cpp --model HF_DIR --out DIR
        [--python /work/venvs/llamacpp/bin/python] [--pagoda DIR/quant_1p5b.json]

--llama-cpp is a llama.cpp checkout built for the CPU (cmake -B build
-DGGML_NATIVE=ON && cmake --build build --target llama-bench llama-quantize);
--python is an interpreter with its converter's dependencies (its gguf-py,
sentencepiece, torch, transformers). The script converts the Hugging Face
checkpoint to a bf16 GGUF with convert_hf_to_gguf.py, quantizes it to Q4_0 and
Q8_0 with llama-quantize, and runs llama-bench for each:

* `-p 0 -n 64 -t 2`: llama.cpp's own wall-clock tok/s (the usual figure; on a
  loaded host it measures the load);
* CPU time on one thread: `-t 1 -r R` at -n 64 and at -n 16, the child's CPU
  time (user + sys, from wait4) differenced, so model loading, warm-up and
  start-up cancel (its warm-up generates one token whatever -n says):
  tok/s = 48 * R / (cpu(64) - cpu(16)). That is comparable with bench/quant_1p5b.py's CPU-time
  decode figures (the engine thread's time on one thread).

The random checkpoint's byte-level BPE tokenizer is not one llama.cpp's
converter knows by hash; it is a GPT-2-style byte-level BPE like Qwen2's, so
the converter is told "qwen2" for its pre-tokenizer (it only affects
tokenization, which llama-bench does not use). Writes DIR/llamacpp.json and
prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

_CONVERT = """
import runpy, sys
root = sys.argv[1]
sys.path[:0] = [root, root + "/gguf-py"]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[2:]]
runpy.run_path(root + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def _bench(bin_dir: Path, gguf: Path, args: list[str], stdout: Path) -> tuple[dict, float]:
    """llama-bench's JSON record and its CPU seconds (user + sys, from wait4)."""
    cmd = [str(bin_dir / "llama-bench"), "-m", str(gguf), "-o", "json", *args]
    with open(stdout, "w") as out, open(stdout.with_suffix(".stderr"), "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): see {err.name}")
    return json.loads(stdout.read_text())[0], usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-cpp", required=True, type=Path)
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--python", default="/work/venvs/llamacpp/bin/python")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--pagoda", type=Path, default=None, help="quant_1p5b.json to set beside")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "llama-bench.json"
    bin_dir = args.llama_cpp / "build" / "bin"
    bf16 = args.out / "model-bf16.gguf"
    if not bf16.exists():
        subprocess.run(
            [args.python, "-c", _CONVERT, str(args.llama_cpp), str(args.model),
             "--outtype", "bf16", "--outfile", str(bf16)],
            check=True,
        )  # fmt: skip
    rows = {}
    for qtype in ("Q4_0", "Q8_0"):
        gguf = args.out / f"model-{qtype}.gguf"
        if not gguf.exists():
            subprocess.run(
                [str(bin_dir / "llama-quantize"), str(bf16), str(gguf), qtype, "2"], check=True
            )
        wall, _ = _bench(
            bin_dir, gguf, ["-p", "0", "-n", "64", "-t", "2", "-r", str(args.reps)], log
        )
        reps = ["-t", "1", "-r", str(args.reps), "-p", "0"]
        _, cpu64 = _bench(bin_dir, gguf, [*reps, "-n", "64"], log)
        _, cpu16 = _bench(bin_dir, gguf, [*reps, "-n", "16"], log)
        rows[qtype] = {
            "file_bytes": gguf.stat().st_size,
            "wall_tok_s_t2": wall["avg_ts"],
            "wall_tok_s_t2_stddev": wall["stddev_ts"],
            "cpu_tok_s_t1": 48 * args.reps / (cpu64 - cpu16),
            "build": wall.get("build_commit"),
            "cpu_info": wall.get("cpu_info"),
        }
        print(qtype, rows[qtype], flush=True)
    report = {"load_average": os.getloadavg(), "time": time.time(), "llama_cpp": rows}
    pagoda = json.loads(args.pagoda.read_text())["methods"] if args.pagoda else {}
    report["pagoda"] = {
        m: {
            "weights_bytes": pagoda[m]["weights_bytes"],
            "cpu_tok_s_b1": pagoda[m]["decode_b1_tok_s"],
        }
        for m in ("int4", "int8", "dense")
        if m in pagoda
    }
    (args.out / "llamacpp.json").write_text(json.dumps(report, indent=2))
    print("| engine, format | weights MiB | batch-1 decode tok/s, CPU time, 1 thread |"
          " llama-bench tok/s -t 2 (wall) |")  # fmt: skip
    print("|---|---|---|---|")
    for qtype, row in rows.items():
        print(
            f"| llama.cpp {qtype} | {row['file_bytes'] / 2**20:.0f} (file) | "
            f"{row['cpu_tok_s_t1']:.2f} | {row['wall_tok_s_t2']:.2f} ± {row['wall_tok_s_t2_stddev']:.2f} |"
        )
    for m, row in report["pagoda"].items():
        print(
            f"| Pagoda {m} | {row['weights_bytes'] / 2**20:.0f} | {row['cpu_tok_s_b1']:.2f} | - |"
        )


if __name__ == "__main__":
    main()
