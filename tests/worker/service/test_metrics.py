"""A worker's /metrics after known traffic: vLLM's names, types, labels, and counts
that match what was sent."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import wait_for
from tests.worker.service.conftest import generate, request

PROMPT = [4] * 9  # two full blocks of 4 and one token: repeats hit 8 cached tokens


def scrape(worker) -> dict:
    """name -> (type, {sample name + sorted labels: value})."""
    text = httpx.get(f"http://127.0.0.1:{worker.server.metrics_port}/metrics", timeout=10).text
    families = {}
    for family in text_string_to_metric_families(text):
        samples = {}
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
        families[family.name] = (family.type, samples)
    return families


def value(families, name: str, sample: str | None = None, **labels: str) -> float:
    _, samples = families[name]
    matches = [
        v
        for (sample_name, sample_labels), v in samples.items()
        if sample_name == (sample or name) and labels.items() <= dict(sample_labels).items()
    ]
    assert len(matches) == 1, (name, sample, labels, samples)
    return matches[0]


def test_metrics_count_the_traffic_with_vllms_names(start_worker):
    worker = start_worker(service={"metrics_port": 0})
    before = scrape(worker)
    assert value(before, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == 0  # warm-up left out
    assert (
        value(before, "vllm:request_success", "vllm:request_success_total", finished_reason="stop")
        == 0
    )

    greedy = dict(temperature=0, max_tokens=5, ignore_eos=True)
    first = generate(worker.stub, PROMPT, **greedy).token_ids()
    for _ in range(2):
        generate(worker.stub, PROMPT, **greedy)
    # Stops on its first token: finish reason stop.
    stopped = generate(worker.stub, PROMPT, temperature=0, max_tokens=5, stop_token_ids=[first[0]])
    assert stopped.token_ids() == first[:1]
    two = generate(worker.stub, [5, 6, 7], temperature=0, max_tokens=3, ignore_eos=True, n=2)
    assert len(two.token_ids(1)) == 3

    after = scrape(worker)
    types = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prefix_cache_queries": "counter",
        "vllm:prefix_cache_hits": "counter",
        "vllm:num_preemptions": "counter",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
        "vllm:request_inference_time_seconds": "histogram",
        "vllm:request_prefill_time_seconds": "histogram",
        "vllm:request_decode_time_seconds": "histogram",
        "vllm:request_prompt_tokens": "histogram",
        "vllm:request_generation_tokens": "histogram",
        "vllm:iteration_tokens_total": "histogram",
        # older names vLLM still serves, which its example Grafana dashboard reads
        "vllm:gpu_cache_usage_perc": "gauge",
        "vllm:time_per_output_token_seconds": "histogram",
        "vllm:request_max_num_generation_tokens": "histogram",
    }
    assert {name: after[name][0] for name in types} == types
    for name, (_, samples) in after.items():
        if name.startswith("vllm:"):
            for _, labels in samples:
                keys = dict(labels)
                assert keys["engine"] == "0", name
                assert keys["model_name"] == worker.server.engine_config.model.name, name
    # 4 requests of 9 prompt tokens, one of 3 tokens with n=2 (two engine requests)
    assert value(after, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == 4 * 9 + 2 * 3
    assert (
        value(after, "vllm:generation_tokens", "vllm:generation_tokens_total") == 3 * 5 + 1 + 2 * 3
    )
    success = "vllm:request_success_total"
    assert value(after, "vllm:request_success", success, finished_reason="length") == 5
    assert value(after, "vllm:request_success", success, finished_reason="stop") == 1
    assert value(after, "vllm:request_success", success, finished_reason="abort") == 0
    assert (
        value(after, "vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total")
        == 4 * 9 + 2 * 3
    )
    # The 3 repeats of PROMPT hit its 2 full blocks; the second sample of n=2 hits nothing
    # (3 tokens: no full block).
    assert value(after, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total") == 3 * 8
    for name in ("e2e_request_latency_seconds", "time_to_first_token_seconds", "request_queue_time_seconds",
                 "request_prefill_time_seconds", "request_decode_time_seconds"):  # fmt: skip
        assert value(after, f"vllm:{name}", f"vllm:{name}_count") == 6
    # Tokens after each sample's first: 3 x 4 + 0 + 2 x 2 gaps.
    assert (
        value(after, "vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count")
        == 16
    )
    assert (
        value(after, "vllm:request_prompt_tokens", "vllm:request_prompt_tokens_sum")
        == 4 * 9 + 2 * 3
    )
    assert value(after, "vllm:num_requests_running") == 0
    assert value(after, "vllm:kv_cache_usage_perc") == 0
    assert (
        value(
            after,
            "vllm:e2e_request_latency_seconds",
            "vllm:e2e_request_latency_seconds_bucket",
            le="7680.0",
        )
        == 6
    )
    steps = value(after, "vllm:iteration_tokens_total", "vllm:iteration_tokens_total_count")
    assert steps >= 5 + 1  # at least one step per token of the longest request

    # A cancelled request counts as aborted.
    call = worker.stub.Generate(
        request(PROMPT, temperature=0, max_tokens=100, ignore_eos=True), timeout=60
    )
    next(call)
    call.cancel()
    wait_for(
        lambda: (
            value(scrape(worker), "vllm:request_success", success, finished_reason="abort") == 1
        ),
        timeout=30,
        interval=0.05,
        what="the abort counted",
    )


def test_a_failing_metric_costs_a_log_line_not_the_engine(start_worker, monkeypatch):
    worker = start_worker()
    metrics = worker.server.engine_loop.metrics

    def broken(*args):
        raise RuntimeError("a metrics bug")

    monkeypatch.setattr(metrics, "_tokens", broken)
    out = generate(worker.stub, PROMPT, temperature=0, max_tokens=3, ignore_eos=True)
    assert len(out.token_ids()) == 3
    assert metrics.has_failed
