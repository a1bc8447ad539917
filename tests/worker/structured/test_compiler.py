from __future__ import annotations

import json
import threading

import pytest

from shared.errors import InvalidRequestError
from shared.structured_outputs import StructuredOutputsParams
from tests.worker.structured.schemas import CHOICES, GRAMMAR, PERSON, REGEX
from worker.structured.compiler import GrammarCompiler, choice_grammar


@pytest.fixture(scope="module")
def compiler(make_checkpoint):
    path = make_checkpoint("llama")
    compiler = GrammarCompiler(path, 512, (2,))
    yield compiler
    compiler.shutdown()


def test_each_kind_compiles_and_is_cached(compiler):
    constraints = [
        StructuredOutputsParams.from_schema(PERSON),
        StructuredOutputsParams(json_object=True),
        StructuredOutputsParams(regex=REGEX),
        StructuredOutputsParams(choice=CHOICES),
        StructuredOutputsParams(grammar=GRAMMAR),
    ]
    before = compiler.num_compiled
    compiled = [compiler.submit(c).result(timeout=60) for c in constraints]
    assert compiler.num_compiled == before + 5
    again = [compiler.submit(c).result(timeout=60) for c in constraints]
    assert [a is b for a, b in zip(compiled, again)] == [True] * 5
    assert compiler.num_compiled == before + 5
    # Equal schemas written differently share one entry.
    reordered = StructuredOutputsParams.from_schema(json.loads(json.dumps(PERSON, sort_keys=True)))
    assert compiler.compile(reordered) is compiled[0]


def test_compiles_off_the_calling_thread(compiler):
    seen = []
    original = compiler._compile

    def spy(constraint):
        seen.append(threading.current_thread().name)
        return original(constraint)

    compiler._compile = spy
    try:
        compiler.submit(StructuredOutputsParams(regex="[a-c]{1,4}")).result(timeout=60)
    finally:
        del compiler._compile
    assert len(seen) == 1 and seen[0].startswith("pagoda-grammar")


@pytest.mark.parametrize(
    "constraint, field, reason",
    [
        (StructuredOutputsParams(json='{"type": "strin"}'), "structured_outputs.json",
         'Unsupported type "strin"'),
        (StructuredOutputsParams(regex="a(b"), "structured_outputs.regex",
         "The parenthesis is not closed"),
        (StructuredOutputsParams(grammar="root ::= foo"), "structured_outputs.grammar",
         'Rule "foo" is not defined'),
    ],
)  # fmt: skip
def test_bad_constraints_name_the_problem(compiler, constraint, field, reason):
    with pytest.raises(InvalidRequestError) as info:
        compiler.submit(constraint).result(timeout=60)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: does not compile: ")
    assert reason in str(info.value)
    assert "/project/cpp" not in str(info.value)


def test_choice_grammar_escapes_quotes():
    assert choice_grammar(("a", 'say "hi"')) == 'root ::= "a" | "say \\"hi\\""'


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "set exactly one of json, json_object, regex, choice, grammar; got none"),
        ({"regex": "a", "choice": ["a"]}, "got regex, choice"),
        ({"json": "{nope"}, "structured_outputs.json: is not valid JSON"),
        ({"json": "[1]"}, "a JSON schema is an object or a boolean"),
        ({"choice": []}, "must list 1 to 1024 strings, got 0"),
        ({"regex": " "}, "structured_outputs.regex: must be a non-empty string"),
    ],
)
def test_form_is_checked_before_compiling(kwargs, message):
    with pytest.raises(InvalidRequestError, match=message.replace("(", r"\(")):
        StructuredOutputsParams(**kwargs)


@pytest.mark.parametrize(
    "schema, where, keyword",
    [
        ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, "#", "'allOf'"),
        ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "#/properties/a", "'not'"),
        ({"type": "array", "items": {"if": {"type": "string"}, "then": {}}}, "#/items", "'if'"),
        ({"anyOf": [{"type": "string", "format": "credit-card"}]}, "#/anyOf/0", "'credit-card'"),
    ],
)  # fmt: skip
def test_keywords_the_grammar_would_ignore_are_refused(compiler, schema, where, keyword):
    with pytest.raises(InvalidRequestError) as info:
        compiler.compile(StructuredOutputsParams.from_schema(schema))
    assert info.value.field == "structured_outputs.json"
    assert str(info.value).startswith(f"structured_outputs.json: {where}: ")
    assert keyword in str(info.value)


def test_a_property_named_like_a_keyword_is_fine(compiler):
    schema = {"type": "object", "properties": {"not": {"type": "string", "format": "date"}}}
    assert compiler.compile(StructuredOutputsParams.from_schema(schema)) is not None
