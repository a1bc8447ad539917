from __future__ import annotations

import pytest

from shared.errors import InvalidRequestError
from shared.sampling_params import SamplingParams


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"n": 0}, "n"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
        ({"logprobs": 21}, "logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"logit_bias": {3: 200.0}}, "logit_bias"),
    ],
)
def test_invalid_values_name_their_field(kwargs, field):
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**kwargs)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


def test_token_ids_checked_against_the_vocabulary():
    with pytest.raises(
        InvalidRequestError,
        match=r"stop_token_ids: token id 99 is outside the vocabulary \[0, 50\)",
    ):
        SamplingParams(stop_token_ids=[99]).validate_token_ids(50)
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        SamplingParams(logit_bias={-1: 1.0}).validate_token_ids(50)


def test_defaults_are_valid_and_greedy_threshold():
    assert not SamplingParams().is_greedy
    assert SamplingParams(temperature=0).is_greedy
    assert SamplingParams(stop_token_ids=[1, 2]).stop_token_ids == (1, 2)


def test_structured_outputs_round_trip_through_the_message():
    from shared.sampling_proto import params_from_proto, params_to_proto
    from shared.structured_outputs import StructuredOutputsParams

    for constraint in (
        StructuredOutputsParams.from_schema({"type": "object"}),
        StructuredOutputsParams(json_object=True),
        StructuredOutputsParams(regex="[a-z]+"),
        StructuredOutputsParams(choice=("a", "b")),
        StructuredOutputsParams(grammar='root ::= "x"'),
    ):
        params = SamplingParams(structured_outputs=constraint)
        assert params_from_proto(params_to_proto(params)).structured_outputs == constraint
    assert SamplingParams().structured_outputs is None
    assert params_from_proto(params_to_proto(SamplingParams())).structured_outputs is None
