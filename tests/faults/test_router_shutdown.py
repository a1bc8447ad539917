"""A stream still running when the router's --shutdown-timeout runs out ends well
formed: each choice gets finish_reason "abort", then an OpenAI-shaped error event and
[DONE]; the router logs no traceback."""

from __future__ import annotations

import json
import signal
import threading

import httpx
import pytest

from tests.faults.conftest import fault_serve
from tests.faults.test_worker_hang import FLAGS
from tests.router.conftest import MODEL


@pytest.mark.slow  # its own pagoda serve: ~15-35 s on a loaded machine
def test_a_stream_cut_by_the_shutdown_timeout_ends_with_finish_reason_and_error(
    make_checkpoint, tmp_path
):
    log = tmp_path / "serve.log"
    with fault_serve(make_checkpoint("llama"), log, *FLAGS, "--shutdown-timeout=0") as serve:
        served, events, started = serve.served, [], threading.Event()
        body = {
            "model": MODEL, "prompt": "keep going", "max_tokens": 1000, "ignore_eos": True,
            "stream": True,
        }  # fmt: skip

        def read() -> None:
            with httpx.stream(
                "POST", f"{served.base_url}/v1/completions", json=body,
                headers=served.headers, timeout=60,
            ) as response:  # fmt: skip
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        events.append(line.removeprefix("data: "))
                        started.set()

        reader = threading.Thread(target=read)
        reader.start()
        assert started.wait(60)
        served.router.process.process.send_signal(signal.SIGTERM)
        reader.join(60)
        assert not reader.is_alive()
        assert served.router.process.process.wait(60) == 0
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "service_unavailable_error"
    assert "--shutdown-timeout 0 s" in error["message"]
    last = json.loads(events[-3])["choices"][0]
    assert last["finish_reason"] == "abort"
    assert all("error" not in json.loads(e) for e in events[:-2])
    assert "Traceback" not in log.read_text(), log.read_text()[-4000:]
