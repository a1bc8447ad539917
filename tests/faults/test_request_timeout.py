"""--request-timeout: a request running past it ends with a clear error (an SSE error
event after finish_reason "abort", or a 504), and its worker call is cancelled, so
the KV blocks return."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import wait_for
from tests.faults.test_fault_table import worker_load
from tests.faults.test_worker_hang import FLAGS
from tests.router.conftest import MODEL


@pytest.mark.slow  # its own pagoda serve: ~20-50 s on a loaded machine
def test_a_request_past_the_request_timeout_ends_clearly_and_frees_its_blocks(
    make_fault_serve,
):
    with make_fault_serve(*FLAGS, "--request-timeout=1.5") as serve:
        served = serve.served
        body = {"model": MODEL, "prompt": "on and on", "max_tokens": 1000, "ignore_eos": True}
        with httpx.Client(base_url=served.base_url, headers=served.headers, timeout=60) as http:
            whole = http.post("/v1/completions", json=body)
            assert whole.status_code == 504, whole.text
            assert "--request-timeout (1.5 s)" in whole.json()["error"]["message"]
            with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as raw:
                events = [line[6:] for line in raw.iter_lines() if line.startswith("data: ")]
            short = http.post("/v1/completions", json={**body, "max_tokens": 4})
            assert short.status_code == 200  # within the limit: unaffected
        assert events[-1] == "[DONE]" and "--request-timeout" in events[-2]
        assert json.loads(events[-3])["choices"][0]["finish_reason"] == "abort"
        for worker in serve.pids:
            address = f"127.0.0.1:{worker.rsplit('-', 1)[1]}"
            wait_for(lambda a=address: worker_load(a).num_kv_blocks_used == 0, timeout=10)
