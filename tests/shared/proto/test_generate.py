"""The committed stubs are exactly what `python -m shared.proto.generate` makes."""

from __future__ import annotations

import shutil

from shared.proto import generate


def test_committed_stubs_match_protos():
    stale = generate.stale_stubs()
    assert not stale, f"regenerate with `python -m shared.proto.generate`: {stale}"


def test_a_changed_proto_is_caught(tmp_path, monkeypatch):
    # The check must be able to fail: edit a copy of the protos and compare again.
    protos = tmp_path / "protos"
    shutil.copytree(generate.PROTO_ROOT, protos)
    proto = next(protos.rglob("worker.proto"))
    proto.write_text(proto.read_text().replace("int32 rank = 3;", "int64 rank = 3;"))
    monkeypatch.setattr(generate, "PROTO_ROOT", protos)
    assert "pagoda/worker/v1/worker_pb2.py" in generate.stale_stubs()


def test_stubs_import_from_shared():
    from shared.proto.pagoda.worker.v1 import worker_pb2, worker_pb2_grpc

    assert worker_pb2.DESCRIPTOR.package == "pagoda.worker.v1"
    assert hasattr(worker_pb2_grpc, "WorkerServiceStub")
    params = worker_pb2.SamplingParams(max_tokens=0)
    assert params.HasField("max_tokens") and not params.HasField("temperature")


def test_client_api_stubs_import_from_shared():
    from shared.proto.pagoda.v1 import router_pb2, router_pb2_grpc

    assert router_pb2.DESCRIPTOR.package == "pagoda.v1"
    assert hasattr(router_pb2_grpc, "RouterServiceStub")
    request = router_pb2.CompleteRequest(token_ids=router_pb2.TokenIds(ids=[1, 2]))
    assert request.WhichOneof("prompt") == "token_ids"
