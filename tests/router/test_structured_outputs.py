"""Constrained answers through the official openai client against `pagoda serve`: a
random-weight model's every answer satisfies its constraint (which random text
never does), streamed equal to whole for the same seed."""

from __future__ import annotations

import json
import re
from typing import Literal

import jsonschema
import openai
import pydantic
import pytest

from tests.router.conftest import MODEL
from tests.worker.structured.schemas import CHOICES, GRAMMAR, PERSON, REGEX

MESSAGES = [{"role": "user", "content": "Who is on the team?"}]
SCHEMA_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "person", "schema": PERSON, "strict": True},
}


def chat(client, n=4, seed=11, **kwargs):
    params = dict(model=MODEL, messages=MESSAGES, n=n, seed=seed, temperature=1.0, max_tokens=100)
    return client.chat.completions.create(**(params | kwargs))


def streamed_texts(client, n=4, seed=11, **kwargs) -> list[str]:
    texts = [""] * n
    for chunk in chat(client, n=n, seed=seed, stream=True, **kwargs):
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    return texts


def test_chat_json_schema_validates_and_streams_the_same(served):
    client = served.client()
    whole = chat(client, response_format=SCHEMA_FORMAT)
    texts = [c.message.content for c in whole.choices]
    for choice, text in zip(whole.choices, texts):
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(text), PERSON)
    assert streamed_texts(client, response_format=SCHEMA_FORMAT) == texts


def test_chat_json_object_and_completions_json_schema(served):
    client = served.client()
    out = chat(client, n=4, max_tokens=40, response_format={"type": "json_object"})
    for choice in out.choices:
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)
        else:  # an object may nest past max_tokens
            assert choice.message.content.startswith("{")
    completion = client.completions.create(
        model=MODEL, prompt="A person:", n=4, seed=3, temperature=1.0, max_tokens=100,
        extra_body={"response_format": SCHEMA_FORMAT},
    )  # fmt: skip
    for choice in completion.choices:
        jsonschema.validate(json.loads(choice.text), PERSON)


def test_openai_parse_helper_with_a_pydantic_model(served):
    class Pick(pydantic.BaseModel):
        team: Literal["red", "green", "blue"]
        admin: bool
        level: int = pydantic.Field(ge=1, le=5)

    out = served.client().chat.completions.parse(
        model=MODEL, messages=MESSAGES, response_format=Pick, seed=5, temperature=1.0,
        max_tokens=60,
    )  # fmt: skip
    assert isinstance(out.choices[0].message.parsed, Pick)


@pytest.mark.parametrize(
    "extra, check",
    [
        ({"structured_outputs": {"regex": REGEX}}, lambda t: re.fullmatch(REGEX, t)),
        ({"guided_regex": REGEX}, lambda t: re.fullmatch(REGEX, t)),
        ({"structured_outputs": {"choice": list(CHOICES)}}, lambda t: t in CHOICES),
        ({"guided_choice": list(CHOICES)}, lambda t: t in CHOICES),
        ({"guided_grammar": GRAMMAR}, lambda t: re.fullmatch(r"\((\d\+)*\d\)", t)),
        ({"structured_outputs": {"json": PERSON}}, lambda t: jsonschema.validate(json.loads(t), PERSON) is None),
        ({"guided_json": json.dumps(PERSON)}, lambda t: jsonschema.validate(json.loads(t), PERSON) is None),
    ],
    ids=["so-regex", "guided-regex", "so-choice", "guided-choice", "guided-grammar", "so-json", "guided-json"],
)  # fmt: skip
def test_vllm_constraint_fields(served, extra, check):
    client = served.client()
    out = client.completions.create(
        model=MODEL, prompt="Answer:", n=3, seed=8, temperature=1.0, max_tokens=100,
        extra_body=extra,
    )  # fmt: skip
    for choice in out.choices:
        assert choice.finish_reason == "stop"
        assert check(choice.text), choice.text


@pytest.mark.parametrize(
    "extra, field, reason",
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
         "structured_outputs.json", 'Unsupported type "strin"'),
        ({"guided_regex": "a(b"}, "structured_outputs.regex", "parenthesis is not closed"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "set only one"),
        ({"response_format": {"type": "xml"}}, "response_format.type", "must be text, json_object"),
        ({"structured_outputs": {"yaml": "x"}}, "structured_outputs.yaml", "is not supported"),
        ({"guided_json": "{nope"}, "guided_json", "is not valid JSON"),
    ],
)  # fmt: skip
def test_bad_constraints_are_400_naming_the_problem(served, extra, field, reason):
    with pytest.raises(openai.BadRequestError) as info:
        served.client().chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=5, extra_body=extra
        )
    message = info.value.body["message"]
    assert message.startswith(f"{field}: ") and reason in message, message


SLOW_CASES = {
    "json_schema": ({"response_format": SCHEMA_FORMAT},
                    lambda t: jsonschema.validate(json.loads(t), PERSON) is None),
    "regex": ({"structured_outputs": {"regex": REGEX}}, lambda t: re.fullmatch(REGEX, t)),
    "choice": ({"structured_outputs": {"choice": list(CHOICES)}}, lambda t: t in CHOICES),
    "grammar": ({"structured_outputs": {"grammar": GRAMMAR}},
                lambda t: re.fullmatch(r"\((\d\+)*\d\)", t)),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SLOW_CASES))
def test_fifty_seeded_samples_validate_streamed_and_not(served, case):
    extra, check = SLOW_CASES[case]
    client = served.client()
    whole = chat(client, n=50, seed=21, max_tokens=120, extra_body=extra)
    texts = [c.message.content for c in whole.choices]
    for choice, text in zip(whole.choices, texts):
        assert choice.finish_reason == "stop"
        assert check(text), text
    assert streamed_texts(client, n=50, seed=21, max_tokens=120, extra_body=extra) == texts
