"""Random weights, constrained: every output must satisfy its constraint, which
unconstrained random text never does, so these fail if the mask is skipped."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from shared.structured_outputs import StructuredOutputsParams
from tests.conftest import random_prompts
from tests.worker.structured.schemas import CHOICES, GRAMMAR, PERSON, POINTS, REGEX
from worker import LLM, SamplingParams

OPTIONS = dict(block_size=4, max_model_len=256, num_kv_blocks=512)


@pytest.fixture(scope="module")
def llm(make_checkpoint):
    return LLM(str(make_checkpoint("llama")), **OPTIONS)


def sample(llm, constraint, n_prompts=3, **params):
    params = SamplingParams(
        **{"temperature": 1.0, "max_tokens": 120, "seed": 7, "structured_outputs": constraint}
        | params
    )
    return [c for out in llm.generate(random_prompts([5] * n_prompts, seed=3), params)
            for c in out.outputs]  # fmt: skip


@pytest.mark.parametrize("schema", [PERSON, POINTS])
def test_json_schema_outputs_validate(llm, schema):
    for completion in sample(llm, StructuredOutputsParams.from_schema(schema)):
        assert completion.finish_reason == "stop"
        jsonschema.validate(json.loads(completion.text), schema)


def test_greedy_rows_are_masked_too(llm):
    constraint = StructuredOutputsParams.from_schema(PERSON)
    for completion in sample(llm, constraint, n_prompts=2, temperature=0):
        jsonschema.validate(json.loads(completion.text), PERSON)


def test_json_object_regex_choice_grammar(llm):
    for completion in sample(llm, StructuredOutputsParams(json_object=True), max_tokens=40):
        if completion.finish_reason == "stop":  # an object may nest past max_tokens
            assert isinstance(json.loads(completion.text), dict)
        else:
            assert completion.text.startswith("{")
    for completion in sample(llm, StructuredOutputsParams(regex=REGEX)):
        assert re.fullmatch(REGEX, completion.text), completion.text
    texts = {c.text for c in sample(llm, StructuredOutputsParams(choice=CHOICES), n_prompts=6)}
    assert texts <= set(CHOICES) and len(texts) > 1
    for completion in sample(llm, StructuredOutputsParams(grammar=GRAMMAR)):
        assert re.fullmatch(r"\((\d\+)*\d\)", completion.text), completion.text


def test_n_samples_and_unconstrained_neighbours(llm):
    constrained = SamplingParams(
        n=2, temperature=1.0, seed=1, max_tokens=120,
        structured_outputs=StructuredOutputsParams.from_schema(PERSON),
    )  # fmt: skip
    free = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = random_prompts([6, 6], seed=5)
    outs = llm.generate(prompts, [constrained, free])
    assert [len(o.outputs) for o in outs] == [2, 1]
    for completion in outs[0].outputs:
        jsonschema.validate(json.loads(completion.text), PERSON)
    # The unconstrained neighbour is what it is alone.
    (alone,) = llm.generate([prompts[1]], free)
    assert outs[1].outputs[0].token_ids == alone.outputs[0].token_ids


def test_grammar_end_finishes_even_under_ignore_eos(llm):
    for completion in sample(llm, StructuredOutputsParams(choice=CHOICES), ignore_eos=True):
        assert completion.finish_reason == "stop"
        assert completion.text in CHOICES


def test_preempted_requests_still_validate(make_checkpoint):
    llm = LLM(str(make_checkpoint("llama")), block_size=4, max_model_len=120, num_kv_blocks=30)
    params = SamplingParams(
        temperature=1.0, seed=2, max_tokens=90,
        structured_outputs=StructuredOutputsParams.from_schema(PERSON),
    )  # fmt: skip
    outs = llm.generate(random_prompts([24] * 3, seed=9), params)
    assert llm.engine.core.scheduler.num_preemptions > 0
    for out in outs:
        jsonschema.validate(json.loads(out.outputs[0].text), PERSON)


def test_a_grammar_that_ends_before_min_tokens_ends_the_answer(llm):
    # min_tokens bans EOS, the finished grammar allows nothing else: the grammar wins.
    for completion in sample(llm, StructuredOutputsParams(choice=CHOICES), min_tokens=30):
        assert completion.finish_reason == "stop"
        assert completion.text in CHOICES
        assert completion.token_ids[-1] == 2  # the EOS the grammar ended with
