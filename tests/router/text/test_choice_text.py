"""A choice's worker outputs become text deltas: tokens, stop strings, finish reasons."""

from __future__ import annotations

from router.text.choice_text import ChoiceText, TextOptions
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb


def output(token_ids, finish=wpb.FINISH_REASON_UNSPECIFIED, **kwargs) -> wpb.SampleOutput:
    return wpb.SampleOutput(token_ids=token_ids, finish_reason=finish, **kwargs)


def test_a_stop_string_inside_a_split_character_counts_tokens_up_to_it(tokenizer):
    text = "中文字符需要三个字节。"
    ids = tokenizer.encode(text)
    choice = ChoiceText(0, tokenizer, [], TextOptions(stop=("需要",)))
    # All tokens in one worker response: the count still stops at the stop string.
    delta = choice.push(output(ids))
    assert (
        delta.text == "中文字符" and delta.finish_reason == "stop" and delta.stop_reason == "需要"
    )
    prefix_ids = tokenizer.encode("中文字符需要")
    assert choice.num_tokens <= len(prefix_ids) + 1 and choice.num_tokens < len(ids)
    assert choice.is_finished and choice.push(output([5])) is None


def test_the_worker_finish_releases_held_text_and_names_the_stop_token(tokenizer):
    ids = tokenizer.encode("hello ab")
    choice = ChoiceText(3, tokenizer, [], TextOptions(stop=("abc",)))
    first = choice.push(output(ids))
    assert first.text == "hello " and first.finish_reason is None
    last = choice.push(output([2], wpb.FINISH_REASON_STOP, stop_token_id=2))
    assert (last.index, last.text, last.finish_reason, last.stop_reason) == (3, "ab", "stop", 2)
    assert choice.num_tokens == len(ids) + 1


def test_length_finish_and_included_stop_string(tokenizer):
    ids = tokenizer.encode("one two three")
    choice = ChoiceText(
        0, tokenizer, [], TextOptions(stop=("two",), include_stop_str_in_output=True)
    )
    delta = choice.push(output(ids, wpb.FINISH_REASON_LENGTH))
    assert delta.text == "one two" and delta.finish_reason == "stop"
    plain = ChoiceText(0, tokenizer, [])
    assert plain.push(output(ids, wpb.FINISH_REASON_LENGTH)).finish_reason == "length"


def test_stop_strings_count_only_from_min_tokens_on(tokenizer):
    ids = tokenizer.encode("one two three two four")
    early = ids.index(tokenizer.encode(" two")[0]) + 1  # tokens up to the first " two"
    choice = ChoiceText(0, tokenizer, [], TextOptions(stop=(" two",), min_tokens=early + 1))
    delta = choice.push(output(ids))
    # The first " two" ends before min_tokens, so only the second one stops the text.
    assert delta.text == "one two three" and delta.stop_reason == " two"
    assert choice.num_tokens == len(tokenizer.encode("one two three two"))
    without = ChoiceText(0, tokenizer, [], TextOptions(stop=(" two",)))
    assert without.push(output(ids)).text == "one"
