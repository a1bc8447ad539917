"""--max-logprobs (vLLM's flag): the worker refuses more, and announces its limit,
which the router enforces from GetModelInfo."""

from __future__ import annotations

import grpc
import pytest

from shared.errors import ConfigError
from shared.proto.pagoda.worker.v1 import worker_pb2 as pb
from tests.worker.service.conftest import generate
from worker.config import ModelConfig


def test_a_lower_limit_is_announced_and_enforced(start_worker):
    worker = start_worker(max_logprobs=2)
    assert worker.stub.GetModelInfo(pb.GetModelInfoRequest()).max_logprobs == 2
    out = generate(worker.stub, [5, 6, 7], temperature=0, max_tokens=2, logprobs=2)
    assert len(out.responses[-1].outputs[-1].logprobs[-1].top) == 2
    for field in ("logprobs", "prompt_logprobs"):
        with pytest.raises(grpc.RpcError) as caught:
            generate(worker.stub, [5, 6, 7], temperature=0, max_tokens=2, **{field: 3})
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.details() == (
            f"{field}: must be in [0, 2] on this server (--max-logprobs), got 3"
        )


def test_more_than_pagodas_own_limit_is_refused():
    with pytest.raises(ConfigError, match=r"--max-logprobs must be in \[0, 20\]"):
        ModelConfig(model="m", max_logprobs=21)
