"""The gRPC text API (pagoda.v1.RouterService) against `pagoda serve`."""

from __future__ import annotations

import json
import re

import grpc
import jsonschema
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from shared.proto.pagoda.v1 import router_pb2 as pb
from shared.proto.pagoda.v1 import router_pb2_grpc as pb_grpc
from tests.router.conftest import API_KEY, MODEL
from tests.worker.structured.schemas import PERSON, REGEX

AUTH = (("authorization", f"Bearer {API_KEY}"),)
PROMPT = "Emoji need four bytes: 🚀🐍"


@pytest.fixture(scope="module")
def channel(served):
    with grpc.insecure_channel(f"127.0.0.1:{served.router.grpc_port}") as channel:
        yield channel


def collect(responses) -> tuple[dict[int, str], dict[int, list[int]], dict[int, int], pb.Usage]:
    texts, ids, finish, usage = {}, {}, {}, None
    for response in responses:
        for choice in response.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            ids.setdefault(choice.index, []).extend(choice.token_ids)
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
        if response.HasField("usage"):
            usage = response.usage
    return texts, ids, finish, usage


def test_complete_streams_what_http_returns(channel, served, tokenizer):
    stub = pb_grpc.RouterServiceStub(channel)
    params = pb.SamplingParams(temperature=0, max_tokens=12)
    request = pb.CompleteRequest(model=MODEL, text=PROMPT, sampling_params=params)
    call = stub.Complete(request, metadata=AUTH, timeout=60)
    texts, ids, finish, usage = collect(call)
    # The worker that served it, in the trailing metadata as in the HTTP header.
    workers = dict(call.trailing_metadata())["x-pagoda-worker"]
    assert re.fullmatch(r"[^,]+-\d+", workers), workers
    http = served.client().completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0
    )
    assert texts[0] == http.choices[0].text
    assert tokenizer.decode(ids[0]) == texts[0]
    assert usage.completion_tokens == len(ids[0]) == http.usage.completion_tokens
    assert usage.prompt_tokens == len(tokenizer.encode(PROMPT))
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert finish[0] in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP)


def test_stream_interval_batches_the_grpc_stream_too(channel):
    stub = pb_grpc.RouterServiceStub(channel)

    def complete(**extra) -> tuple[str, int, list[int]]:
        params = pb.SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, **extra)
        responses = list(
            stub.Complete(
                pb.CompleteRequest(model=MODEL, text=PROMPT, sampling_params=params),
                metadata=AUTH,
                timeout=60,
            )
        )
        texts, ids, *_ = collect(responses)
        return texts[0], sum(1 for r in responses for c in r.choices if c.token_ids), ids[0]

    text, pieces, ids = complete()
    held_text, held_pieces, held_ids = complete(stream_interval=6)
    assert (held_text, held_ids) == (text, ids) and len(ids) == 16
    # The first token, then 6, 6 and the last 3 with the finish.
    assert held_pieces <= 4 < pieces


def test_chat_with_token_ids_n_and_a_stop_string(channel):
    stub = pb_grpc.RouterServiceStub(channel)
    chat = pb.ChatRequest(
        model=MODEL,
        messages=[pb.ChatMessage(role="user", content="hello")],
        sampling_params=pb.SamplingParams(temperature=0, max_tokens=10),
    )
    texts, *_ = collect(stub.Chat(chat, metadata=AUTH, timeout=60))
    stop = texts[0][4:6]
    chat.sampling_params.stop.append(stop)
    chat.sampling_params.n = 2
    cut, _, finish, _ = collect(stub.Chat(chat, metadata=AUTH, timeout=60))
    expected = texts[0][: texts[0].find(stop)]
    assert cut == {0: expected, 1: expected}  # greedy: both choices alike
    assert finish == {0: pb.FINISH_REASON_STOP, 1: pb.FINISH_REASON_STOP}


@pytest.mark.parametrize(
    "request_, metadata, code",
    [
        (pb.CompleteRequest(model="other", text="x"), AUTH, grpc.StatusCode.NOT_FOUND),
        (pb.CompleteRequest(model=MODEL, text="x"), (), grpc.StatusCode.UNAUTHENTICATED),
        (
            pb.CompleteRequest(model=MODEL, text="x", sampling_params=pb.SamplingParams(top_p=0)),
            AUTH,
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            pb.CompleteRequest(model=MODEL, token_ids=pb.TokenIds(ids=[5] * 300)),
            AUTH,
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
    ],
)
def test_errors_keep_their_meaning(channel, request_, metadata, code):
    stub = pb_grpc.RouterServiceStub(channel)
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Complete(request_, metadata=metadata, timeout=30))
    assert caught.value.code() == code


def test_list_models_health_and_reflection(channel):
    models = pb_grpc.RouterServiceStub(channel).ListModels(
        pb.ListModelsRequest(), metadata=AUTH, timeout=10
    )
    assert [(m.id, m.max_model_len, m.num_workers) for m in models.models] == [(MODEL, 256, 2)]
    status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert status.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = reflection.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
    )
    names = {s.name for a in answers for s in a.list_services_response.service}
    assert "pagoda.v1.RouterService" in names and "grpc.health.v1.Health" in names


def test_complete_and_chat_take_structured_outputs(channel):
    stub = pb_grpc.RouterServiceStub(channel)
    schema = pb.StructuredOutputs(json=json.dumps(PERSON))
    params = pb.SamplingParams(
        n=3, seed=2, temperature=1.0, max_tokens=100, structured_outputs=schema
    )
    chat = pb.ChatRequest(
        model=MODEL, messages=[pb.ChatMessage(role="user", content="hi")], sampling_params=params
    )
    texts, _, finish, _ = collect(stub.Chat(chat, metadata=AUTH, timeout=60))
    for index in range(3):
        assert finish[index] == pb.FINISH_REASON_STOP
        jsonschema.validate(json.loads(texts[index]), PERSON)
    regex = pb.SamplingParams(
        temperature=1.0, seed=1, max_tokens=30, structured_outputs=pb.StructuredOutputs(regex=REGEX)
    )
    request = pb.CompleteRequest(model=MODEL, text=PROMPT, sampling_params=regex)
    texts, *_ = collect(stub.Complete(request, metadata=AUTH, timeout=60))
    assert re.fullmatch(REGEX, texts[0]), texts[0]
    bad = pb.SamplingParams(structured_outputs=pb.StructuredOutputs(regex="a(b"))
    with pytest.raises(grpc.RpcError) as info:
        collect(stub.Complete(pb.CompleteRequest(model=MODEL, text=PROMPT, sampling_params=bad),
                              metadata=AUTH, timeout=60))  # fmt: skip
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("structured_outputs.regex: does not compile")
