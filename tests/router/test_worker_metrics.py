"""The router's merge of worker metrics: a worker label on every series, one family
per name, and a worker that does not answer marked down instead of failing /metrics."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client.parser import text_string_to_metric_families

from router.worker_metrics import WorkerMetricsScraper, parse_target
from shared.ports import free_port_run

WORKER_TEXT = b"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
"""


def serve(body: bytes) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_targets_name_their_worker():
    assert parse_target("w0=http://h:1/metrics") == ("w0", "http://h:1/metrics")
    assert parse_target("http://h:1/metrics") == ("h:1", "http://h:1/metrics")


def test_series_of_every_worker_merge_and_a_silent_worker_is_down():
    good, garbage = serve(WORKER_TEXT), serve(b"{not prometheus text")
    try:
        targets = [
            f"a=http://127.0.0.1:{good.server_port}/metrics",
            f"b=http://127.0.0.1:{good.server_port}/metrics",
            f"c=http://127.0.0.1:{garbage.server_port}/metrics",
            f"d=http://127.0.0.1:{free_port_run()}/metrics",  # nothing listens
        ]
        text = asyncio.run(WorkerMetricsScraper(targets).render()).decode()
    finally:
        good.shutdown()
        garbage.shutdown()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    running = families["vllm:num_requests_running"]
    assert running.type == "gauge"
    assert sorted((s.labels["worker"], s.value) for s in running.samples) == [
        ("a", 3.0),
        ("b", 3.0),
    ]
    assert all(s.labels["model_name"] == "m" for s in running.samples)
    up = {s.labels["worker"]: s.value for s in families["pagoda_router_worker_metrics_up"].samples}
    assert up == {"a": 1.0, "b": 1.0, "c": 0.0, "d": 0.0}
