"""SIGKILL of the worker serving streams, mid-stream: every stream goes on, on the
other worker, and its text equals an undisturbed run's, greedy and seeded alike."""

from __future__ import annotations

import os
import re
import signal
from collections import Counter

import httpx

from tests.conftest import wait_for
from tests.faults.conftest import PROMPTS, start_streams, undisturbed, wait_all

MAX_TOKENS = 200
GREEDY = {"max_tokens": MAX_TOKENS, "extra_body": {"ignore_eos": True}, "temperature": 0}
REQUESTS = [(p, GREEDY) for p in PROMPTS[:3]] + [
    (p, {**GREEDY, "temperature": 1.0, "top_p": 0.9, "seed": 7 + i})
    for i, p in enumerate(PROMPTS[3:])
]


def migrations(base_url: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=5).text
    return float(re.search(r"^pagoda_router_migrations_total ([0-9.]+)$", text, re.M).group(1))


def test_sigkill_of_the_serving_worker_mid_stream_loses_no_token(make_fault_serve):
    with make_fault_serve() as serve:
        client = serve.client()
        expected = undisturbed(client, REQUESTS)
        results = start_streams(client, REQUESTS)
        wait_for(
            lambda: all(r.num_chunks >= 5 or r.done.is_set() for r in results),
            what="every stream under way",
        )
        victim = Counter(r.worker for r in results if not r.done.is_set()).most_common(1)[0][0]
        cut = [r for r in results if r.worker == victim and not r.done.is_set()]
        os.kill(serve.pids[victim], signal.SIGKILL)
        wait_all(results)
        assert cut, "no stream was open on the killed worker"
        for got, want in zip(results, expected):
            assert got.error is None, got.error
            assert (got.finish_reason, got.completion_tokens) == ("length", MAX_TOKENS)
            assert got.text == want.text, (got.prompt, got.params)
        assert migrations(serve.served.base_url) >= 1
