"""Router start-up: a gRPC port in use is refused as the HTTP one is, and
`pagoda serve` says "serving at" only once a worker serves."""

from __future__ import annotations

from shared.ports import free_port_run
from tests.cluster import PagodaProcess, http_up, start_router
from tests.conftest import wait_for


def test_a_second_router_on_a_grpc_port_in_use_refuses_to_start(tmp_path):
    dead = f"--worker=127.0.0.1:{free_port_run()}"
    first = start_router("router", [dead], tmp_path / "first.log")
    try:
        wait_for(lambda: http_up(first), timeout=60, interval=0.2, what="the first router")
        flags = ["--host=127.0.0.1", f"--port={free_port_run()}", f"--grpc-port={first.grpc_port}"]
        second = PagodaProcess("router", [dead, *flags], tmp_path / "second.log")
        assert second.process.wait(60) == 2, second.log()
        second.stop()
        assert f"cannot listen for gRPC on 127.0.0.1:{first.grpc_port}" in second.log()
        assert "is the port in use?" in second.log()
    finally:
        first.process.stop()


def test_serve_says_serving_only_once_a_worker_serves(served):
    log = served.router.process.log()
    ready = log.index("router.serve: serving at ")
    assert log.index("worker.service.server: serving ") < ready
    assert "(2 of 2 workers ready" in log or "(1 of 2 workers ready" in log
