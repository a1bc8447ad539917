"""SIGKILL of the worker serving streams, mid-stream: every stream goes on, on the
other worker, and its text equals an undisturbed run's, greedy and seeded alike;
then `pagoda serve` starts the killed worker again and the router takes it back."""

from __future__ import annotations

import os
import re
import signal
from collections import Counter

import httpx

from tests.cluster import health
from tests.conftest import wait_for
from tests.faults.conftest import PROMPTS, start_streams, undisturbed, wait_all

MAX_TOKENS = 200
GREEDY = {"max_tokens": MAX_TOKENS, "extra_body": {"ignore_eos": True}, "temperature": 0}
SEEDED = {**GREEDY, "temperature": 1.0, "top_p": 0.9}
REQUESTS = [(p, GREEDY) for p in PROMPTS[:3]] + [
    (p, {**SEEDED, "seed": 7 + i}) for i, p in enumerate(PROMPTS[3:])
]
# Several choices: each resumes on its own, seeded from seed + its index.
SAMPLES = [(PROMPTS[0], {**SEEDED, "seed": 3, "n": 3}), (PROMPTS[1], {**SEEDED, "n": 2})]


def counter(base_url: str, name: str) -> float:
    """A router counter's value (name with its labels); 0 when it has none yet."""
    text = httpx.get(f"{base_url}/metrics", timeout=5).text
    found = re.search(rf"^pagoda_router_{re.escape(name)} ([0-9.]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def migrations(base_url: str) -> float:
    return counter(base_url, "migrations_total")


def test_sigkill_of_the_serving_worker_mid_stream_loses_no_token(make_fault_serve):
    with make_fault_serve() as serve:
        client = serve.client()
        expected = undisturbed(client, REQUESTS + SAMPLES[:1])
        results = start_streams(client, REQUESTS + SAMPLES)
        wait_for(
            lambda: all(r.num_chunks >= 5 or r.done.is_set() for r in results),
            what="every stream under way",
        )
        victim = Counter(r.worker for r in results if not r.done.is_set()).most_common(1)[0][0]
        cut = [r for r in results if r.worker == victim and not r.done.is_set()]
        os.kill(serve.pids[victim], signal.SIGKILL)
        wait_all(results)
        assert cut, "no stream was open on the killed worker"
        for got, want in zip(results, expected):  # the unseeded n = 2 has no twin
            assert got.error is None, got.error
            assert got.text == want.text, (got.prompt, got.params)
        for got in results:
            n = got.params.get("n", 1)
            assert (got.finish_reason, got.completion_tokens) == ("length", n * MAX_TOKENS)
            assert len(got.texts) == n and got.error is None, got.error
            # The usage chunk names every worker that served it, the killed one first.
            workers = got.workers.split(",")
            assert workers[0] == got.worker and len(workers) == (
                1 + n if any(got is c for c in cut) else 1
            )
        base_url = serve.served.base_url
        assert migrations(base_url) == len(cut)
        assert counter(base_url, 'failovers_total{reason="died"}') == len(cut)
        # pagoda serve starts it again on its port, and the router takes it back.
        wait_for(lambda: health(serve.served.base_url).get("workers_serving") == 2, timeout=120)
        log = serve.served.router.process.log()
        assert re.search(r"exited with code -9 after \d+ s", log) and "restarting worker" in log
        assert len(re.findall(r"started worker \d+ \(pid", log)) == 3
        assert counter(base_url, f'worker_restarts_total{{worker="{victim}"}}') == 1
