"""Constrained requests over the worker's gRPC API: the grammar compiles while the
engine keeps stepping, and each sample's tokens follow it."""

from __future__ import annotations

import json

import jsonschema
from transformers import AutoTokenizer

from shared.proto.pagoda.worker.v1 import worker_pb2 as pb
from tests.worker.service.conftest import generate, request
from tests.worker.structured.schemas import PERSON


def test_constrained_samples_validate_beside_a_running_request(start_worker, make_checkpoint):
    worker = start_worker()
    tokenizer = AutoTokenizer.from_pretrained(make_checkpoint("llama"))
    long = {"temperature": 0, "max_tokens": 60, "ignore_eos": True}
    running = worker.stub.Generate(request([9, 9, 9], **long), timeout=60)
    next(running)  # stepping while the grammar compiles
    constraint = pb.StructuredOutputs(json=json.dumps(PERSON))
    got = generate(
        worker.stub, [5, 6, 7], n=2, seed=4, temperature=1.0, max_tokens=100,
        structured_outputs=constraint,
    )  # fmt: skip
    for index in range(2):
        assert got.finish_reason(index) == pb.FINISH_REASON_STOP
        text = tokenizer.decode(got.token_ids(index), skip_special_tokens=True)
        jsonschema.validate(json.loads(text), PERSON)
    assert len([t for r in running for o in r.outputs for t in o.token_ids]) == 59
