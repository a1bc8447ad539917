"""Generate with output_token_ids: a request resumed after its worker failed continues
exactly where an undisturbed run would have gone (greedy and seeded, with penalties
and max_tokens counting the tokens given)."""

from __future__ import annotations

import grpc
import pytest

from shared.proto.pagoda.worker.v1 import worker_pb2 as pb
from tests.conftest import random_prompts
from tests.worker.service.conftest import Generation, pool_is_idle, request

PROMPT = random_prompts([11], seed=21)[0]
GREEDY = dict(temperature=0, max_tokens=16, ignore_eos=True)
SEEDED = dict(temperature=1.0, seed=5, frequency_penalty=0.5, max_tokens=16, ignore_eos=True)


def resumed(stub, outputs: list[int], **params) -> Generation:
    message = request(PROMPT, **params)
    message.output_token_ids.extend(outputs)
    return Generation(list(stub.Generate(message, timeout=60)))


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_resumed_request_continues_as_the_undisturbed_run(start_worker, params):
    worker = start_worker()
    whole = resumed(worker.stub, [], **params).token_ids()
    assert len(whole) == 16
    for cut in (1, 6, 15):
        rest = resumed(worker.stub, whole[:cut], **params)
        assert rest.token_ids() == whole[cut:]  # only the new tokens, max_tokens counted
        assert rest.finish_reason() == pb.FINISH_REASON_LENGTH
    assert worker.on_engine(pool_is_idle)


@pytest.mark.parametrize(
    "outputs, params, words",
    [
        ([5], dict(n=2, max_tokens=4), "n must be 1"),
        ([5] * 4, dict(max_tokens=4), "already reach max_tokens (4)"),
        ([99999], dict(max_tokens=4), "outside the vocabulary"),
        ([5], dict(max_tokens=4, prompt_logprobs=1), "prompt_logprobs"),
    ],
)
def test_bad_resumes_are_invalid_argument(start_worker, outputs, params, words):
    worker = start_worker()
    with pytest.raises(grpc.RpcError) as caught:
        resumed(worker.stub, outputs, **params)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        caught.value.details().startswith("output_token_ids:") and words in caught.value.details()
    )
