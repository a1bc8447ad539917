"""Failures during traffic: a worker SIGKILLed, Redis stopped and restarted."""

from __future__ import annotations

import re
import threading
import time
import uuid
from dataclasses import dataclass

import httpx
import openai

from tests.cluster import start_worker, wait_serving
from tests.conftest import wait_for
from tests.router.conftest import MODEL


@dataclass
class Outcome:
    started_at: float
    stream: bool
    worker: str | None = None
    got_text: bool = False
    error: str | None = None


def one_request(client: openai.OpenAI, i: int, stream: bool) -> Outcome:
    outcome = Outcome(time.monotonic(), stream)
    # Distinct from the first token on: cache misses, placed by load.
    prompt = f"{uuid.uuid4().hex[:12]} request {i}"
    kwargs = dict(model=MODEL, prompt=prompt, max_tokens=120, temperature=0)
    kwargs["extra_body"] = {"ignore_eos": True}
    try:
        if stream:
            with client.completions.with_streaming_response.create(stream=True, **kwargs) as raw:
                outcome.worker = raw.headers["x-pagoda-worker"]
                for chunk in raw.parse():
                    outcome.got_text |= bool(chunk.choices and chunk.choices[0].text)
        else:
            raw = client.completions.with_raw_response.create(**kwargs)
            outcome.worker = raw.headers["x-pagoda-worker"]
            assert raw.parse().usage.completion_tokens == 120
    except (openai.OpenAIError, AssertionError) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    return outcome


def traffic(cluster, stop: threading.Event, outcomes: list[Outcome], num_threads: int = 4):
    def loop(thread: int) -> None:
        client = cluster.client("ab"[thread % 2])
        i = 0
        while not stop.is_set():
            outcomes.append(one_request(client, thread * 1000 + i, stream=thread % 2 == 0))
            i += 1

    threads = [threading.Thread(target=loop, args=(t,)) for t in range(num_threads)]
    for thread in threads:
        thread.start()
    return threads


def metric(base_url: str, name: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=5).text
    match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_sigkill_a_worker_during_traffic(cluster):
    extra = start_worker(cluster.model, cluster.worker_args("w2"), cluster.log_dir / "worker-2.log")
    stop, outcomes = threading.Event(), []
    try:
        for name in ("a", "b"):
            wait_serving(cluster.routers[name].process, cluster.routers[name].base_url, 3)
        threads = traffic(cluster, stop, outcomes)
        wait_for(lambda: any(o.worker == "w2" for o in outcomes), timeout=60, what="w2 to serve")
        time.sleep(0.3)  # requests in flight on every worker
        extra.process.kill()
        killed_at = time.monotonic()
        wait_for(
            lambda: "w2" not in cluster.live_worker_ids(), timeout=10, what="w2 to leave Redis"
        )
        dropped_at = time.monotonic()
        time.sleep(2.0)
        stop.set()
        for thread in threads:
            thread.join(120)
    finally:
        stop.set()
        extra.stop()
    failed = [o for o in outcomes if o.error]
    # Only streams that had started on the killed worker fail, with a clear error...
    for outcome in failed:
        assert outcome.stream and outcome.worker == "w2", outcome
        assert (
            outcome.started_at < killed_at and "failed after the response started" in outcome.error
        )
    # ... every request not yet streaming succeeded on another worker, and none after the drop failed.
    assert [o for o in outcomes if o.started_at > dropped_at and o.error] == []
    assert sum(o.started_at > dropped_at for o in outcomes) >= 4
    assert all(o.worker != "w2" for o in outcomes if o.started_at > killed_at + 1.0)


def test_redis_down_keeps_routing_and_affinity_resumes_when_it_returns(cluster):
    router = cluster.routers["a"]
    client = cluster.client("a")
    no_store = 'pagoda_router_routing_decisions_total{reason="no_store"}'
    affinity = 'pagoda_router_routing_decisions_total{reason="affinity"}'
    before = metric(router.base_url, no_store)
    cluster.redis.stop()
    try:
        for i in range(6):
            response = client.completions.create(model=MODEL, prompt=f"no redis {i}", max_tokens=4)
            assert response.usage.completion_tokens == 4
        assert metric(router.base_url, 'pagoda_router_store_up{store="redis"}') == 0.0
        assert metric(router.base_url, no_store) >= before + 6
        assert "Redis at" in router.process.log() and "unreachable" in router.process.log()
    finally:
        cluster.redis.start()
    # Workers register again (their retry backs off up to 5 s) and the router sees Redis back.
    wait_for(
        lambda: sorted(cluster.live_worker_ids()) == ["w0", "w1"], timeout=20, what="workers back"
    )
    up = 'pagoda_router_store_up{store="redis"}'
    for name in ("a", "b"):
        wait_for(
            lambda name=name: metric(cluster.routers[name].base_url, up) == 1.0,
            timeout=10,
            what=f"router {name} to see Redis",
        )
    # Affinity resumes, across routers: turn 1 through a, turn 2 through b.
    affinity_before = metric(cluster.routers["b"].base_url, affinity)
    messages = [{"role": "user", "content": "after the outage, a brand new conversation starts"}]
    first = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=6
    )
    messages += [{"role": "assistant", "content": first.parse().choices[0].message.content}]
    messages += [{"role": "user", "content": "and goes on"}]
    second = cluster.client("b").chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=6
    )
    assert second.headers["x-pagoda-worker"] == first.headers["x-pagoda-worker"]
    num_first = first.parse().usage.prompt_tokens
    assert second.parse().usage.prompt_tokens_details.cached_tokens >= num_first // 4 * 4
    assert metric(cluster.routers["b"].base_url, affinity) == affinity_before + 1
