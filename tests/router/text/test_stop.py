"""Stop strings: found across chunk boundaries, cut exactly, never leaked."""

from __future__ import annotations

import random

import pytest

from router.text.stop import StopChecker


def feed(checker: StopChecker, chunks: list[str]) -> tuple[list[str], str | None]:
    emitted = []
    for chunk in chunks:
        text, stop = checker.push(chunk)
        emitted.append(text)
        if stop is not None:
            return emitted, stop
    emitted.append(checker.flush())
    return emitted, None


def test_a_stop_string_across_chunks_is_cut_before_it():
    emitted, stop = feed(StopChecker(["o w"]), ["Hel", "lo", " wo", "rld"])
    assert "".join(emitted) == "Hell" and stop == "o w"


def test_a_possible_stop_prefix_is_held_until_decided():
    checker = StopChecker(["abc"])
    assert checker.push("xab") == ("x", None)  # "ab" could begin "abc"
    assert checker.push("d") == ("abd", None)  # it did not
    assert checker.push("a") == ("", None)
    assert checker.flush() == "a"  # the end releases what was held


def test_include_stop_str_in_output_and_the_earliest_match_wins():
    checker = StopChecker(["world", "lo"], include_stop_str_in_output=True)
    assert checker.push("hello world") == ("hello", "lo")


def test_no_stop_strings_pass_everything_through():
    checker = StopChecker([])
    assert checker.push("abc") == ("abc", None) and checker.flush() == ""


@pytest.mark.parametrize("seed", range(20))
def test_streamed_cuts_equal_whole_text_cuts(seed):
    rng = random.Random(seed)
    alphabet = "ab c"
    text = "".join(rng.choice(alphabet) for _ in range(60))
    stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(2, 4))) for _ in range(2)]
    chunks, start = [], 0
    while start < len(text):
        size = rng.randint(1, 5)
        chunks.append(text[start : start + size])
        start += size
    emitted, stop = feed(StopChecker(stops), chunks)
    found = [(text.find(s), s) for s in stops if s in text]
    if found:
        start, expected_stop = min(found)
        assert stop == expected_stop and "".join(emitted) == text[:start]
    else:
        assert stop is None and "".join(emitted) == text
    # Never leaked: no prefix of what was emitted contains a stop string.
    assert not any(s in "".join(emitted) for s in stops)
