"""One scrape of `pagoda serve`'s /metrics: the router's own series and both workers'
vLLM series, labelled by worker, with counts that match the traffic sent."""

from __future__ import annotations

import re

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.router.conftest import MODEL

PROMPT = "The pagoda stood on the hill and"


def scrape(served) -> dict[str, tuple[str, list]]:
    text = httpx.get(f"{served.base_url}/metrics", timeout=10).text
    return {f.name: (f.type, f.samples) for f in text_string_to_metric_families(text)}


def total(families, name: str, sample: str, **labels: str) -> float:
    return sum(
        s.value
        for s in families[name][1]
        if s.name == sample and labels.items() <= s.labels.items()
    )


def test_one_scrape_counts_the_traffic_on_every_worker(served, tokenizer):
    log = served.router.process.log()
    ports = re.findall(r"started worker \d+ \(pid \d+\) on port (\d+)", log)
    before = scrape(served)
    client = served.client()
    for i in range(4):  # different prompts: affinity spreads them over both workers
        client.completions.create(
            model=MODEL, prompt=f"{i} {PROMPT}", max_tokens=3, extra_body={"ignore_eos": True}
        )
    after = scrape(served)

    def delta(name: str, sample: str, **labels: str) -> float:
        return total(after, name, sample, **labels) - total(before, name, sample, **labels)

    num_prompt = sum(len(tokenizer.encode(f"{i} {PROMPT}")) for i in range(4))
    assert delta("vllm:prompt_tokens", "vllm:prompt_tokens_total") == num_prompt
    assert delta("vllm:generation_tokens", "vllm:generation_tokens_total") == 4 * 3
    success = "vllm:request_success_total"
    assert delta("vllm:request_success", success, finished_reason="length") == 4
    e2e = "vllm:e2e_request_latency_seconds"
    assert delta(e2e, f"{e2e}_count") == 4
    assert after[e2e][0] == "histogram" and after["vllm:num_requests_running"][0] == "gauge"
    assert (
        delta(
            "pagoda_router_requests",
            "pagoda_router_requests_total",
            api="completions",
            status="200",
        )
        == 4
    )

    workers = {s.labels["worker"] for s in after["vllm:prompt_tokens"][1]}
    assert len(ports) == 2 and {w.rsplit("-", 1)[1] for w in workers} == set(ports)
    for sample in after["vllm:kv_cache_usage_perc"][1]:
        assert sample.labels["model_name"] == MODEL and sample.labels["engine"] == "0"
    up = after["pagoda_router_worker_metrics_up"][1]
    assert sorted(s.value for s in up) == [1.0, 1.0]
