"""Request bodies fuzzed with hypothesis: any JSON at all, and JSON shaped like a
completions or chat request with wild values, parses into a request or raises
InvalidRequestError naming a field; nothing else, and the sampling message built
from a parsed request is valid or the same clean error."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.openai.protocol import ChatCompletionRequest, CompletionRequest, parse_request
from router.openai.sampling import check_supported, request_message
from shared.errors import InvalidRequestError
from shared.sampling_proto import params_from_proto

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = [
    "prompt", "messages", "n", "temperature", "top_p", "seed", "logit_bias", "stop",
    "max_tokens", "logprobs", "top_logprobs", "stream", "stop_token_ids", "allowed_token_ids",
    "min_tokens", "bad_words", "echo", "top_k", "stream_options", "priority",
]  # fmt: skip
bodies = st.fixed_dictionaries(
    {"model": st.just("m")},
    optional={name: json_values for name in FIELDS}
    | {"prompt": st.text(max_size=5) | st.lists(st.integers(-1, 70000), max_size=4)},
)


def check(cls, raw: bytes) -> None:
    try:
        request = parse_request(cls, raw)
    except InvalidRequestError as exc:
        assert exc.field and exc.message
        return
    try:
        check_supported(request)
        max_tokens = getattr(request, "max_tokens", None)
        logprobs = request.logprobs if cls is CompletionRequest else request.top_logprobs
        params_from_proto(request_message(request, max_tokens, logprobs))
    except InvalidRequestError as exc:
        assert exc.field and exc.message


@given(value=json_values)
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
def test_any_json_is_a_request_or_a_clean_400(value):
    raw = json.dumps(value).encode()
    check(CompletionRequest, raw)
    check(ChatCompletionRequest, raw)


@given(body=bodies)
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_request_shaped_json_is_a_request_or_a_clean_400(body):
    raw = json.dumps(body).encode()
    check(CompletionRequest, raw)
    check(ChatCompletionRequest, raw)


@given(raw=st.binary(max_size=40))
@settings(max_examples=100, deadline=None)
def test_arbitrary_bytes_are_a_clean_400(raw):
    check(CompletionRequest, raw)
