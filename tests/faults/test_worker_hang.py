"""A worker that hangs (SIGSTOP) while streaming: within --worker-stall-timeout its
streams move to the other worker and finish as an undisturbed run would; a busy
worker is not taken for a hung one; after SIGCONT the worker rejoins."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import pytest

from tests.cluster import health
from tests.conftest import wait_for
from tests.faults.conftest import STALL_TIMEOUT_S, start_streams, undisturbed, wait_all
from tests.faults.test_worker_kill import REQUESTS, counter, migrations

# Long streams, so that the worker is stopped with most of each still to generate.
MAX_TOKENS = 900
LONG = [(p, {**params, "max_tokens": MAX_TOKENS}) for p, params in REQUESTS]
FLAGS = ("--max-model-len=1024", "--num-kv-blocks=2048", "--max-num-batched-tokens=1024")


@pytest.mark.slow  # ~30 s: two workers, 6 x 900 tokens twice
def test_sigstop_of_the_serving_worker_moves_its_streams_within_the_stall_timeout(
    make_fault_serve,
):
    with make_fault_serve(*FLAGS) as serve:
        client, base_url = serve.client(), serve.served.base_url
        expected = undisturbed(client, LONG)
        assert migrations(base_url) == 0  # busy, polled every 0.2 s: never taken for hung
        results = start_streams(client, LONG)
        wait_for(
            lambda: all(r.num_chunks >= 5 or r.done.is_set() for r in results),
            what="every stream under way",
        )
        victim = Counter(r.worker for r in results if not r.done.is_set()).most_common(1)[0][0]
        cut = [r for r in results if r.worker == victim and not r.done.is_set()]
        os.kill(serve.pids[victim], signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            wait_all(cut, timeout=STALL_TIMEOUT_S + 30)
            moved_in = time.monotonic() - stopped_at
            wait_all(results)
        finally:
            os.kill(serve.pids[victim], signal.SIGCONT)
        assert cut, "no stream was open on the stopped worker"
        # Caught after the stall timeout, and not long after it (a loaded machine).
        assert STALL_TIMEOUT_S <= moved_in < STALL_TIMEOUT_S + 20, moved_in
        for got, want in zip(results, expected):
            assert got.error is None, got.error
            assert (got.finish_reason, got.completion_tokens) == ("length", MAX_TOKENS)
            assert got.text == want.text, (got.prompt, got.params)
        assert migrations(base_url) >= 1
        assert counter(base_url, 'failovers_total{reason="stalled"}') == migrations(base_url)
        # Once it runs again it answers its health watch and load polls: back in rotation.
        wait_for(lambda: health(base_url).get("workers_serving") == 2, timeout=30)
