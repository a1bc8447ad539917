"""Workloads: deterministic from their seed, exact sizes, the structure each one promises."""

from __future__ import annotations

import itertools
import json

import pytest

from bench.workloads import (
    FIRST_TOKEN_ID,
    WORKLOADS,
    Workload,
    make_workload,
    resolve_workloads,
)


@pytest.mark.parametrize("name", WORKLOADS)
def test_same_seed_same_json_other_seed_other_tokens(name):
    first, again = make_workload(name, seed=3), make_workload(name, seed=3)
    assert json.dumps(first.to_json()) == json.dumps(again.to_json())
    assert make_workload(name, seed=4).requests != first.requests


@pytest.mark.parametrize("name", WORKLOADS)
def test_json_round_trip_and_token_range(name, tmp_path):
    workload = make_workload(name, seed=1, vocab_size=1000)
    workload.save(tmp_path / "w.json")
    data = json.loads((tmp_path / "w.json").read_text())
    expected_keys = {"name", "seed", "vocab_size", "requests"} | (
        {"conversations"} if name == "chat" else set()
    )
    assert set(data) == expected_keys
    assert set(data["requests"][0]) == {"prompt_token_ids", "max_tokens"}
    assert Workload.load(tmp_path / "w.json") == workload
    tokens = [t for r in workload.requests for t in r.prompt_token_ids]
    assert min(tokens) >= FIRST_TOKEN_ID and max(tokens) < 1000


def test_mixed_sizes():
    workload = make_workload("mixed")
    assert len(workload.requests) == 64
    prompt_lens = [len(r.prompt_token_ids) for r in workload.requests]
    outputs = [r.max_tokens for r in workload.requests]
    assert min(prompt_lens) >= 16 and max(prompt_lens) <= 256
    assert min(outputs) >= 16 and max(outputs) <= 128
    assert len(set(prompt_lens)) > 30  # drawn, not constant
    assert (workload.num_prompt_tokens, workload.num_output_tokens) == (7897, 4694)


@pytest.mark.parametrize(
    "name, num_requests, prompt_len, max_tokens",
    [("decode", 32, 32, 128), ("prefill", 16, 1024, 1), ("shared-prefix", 32, 544, 32)],
)
def test_fixed_shapes(name, num_requests, prompt_len, max_tokens):
    workload = make_workload(name)
    assert len(workload.requests) == num_requests
    assert {len(r.prompt_token_ids) for r in workload.requests} == {prompt_len}
    assert {r.max_tokens for r in workload.requests} == {max_tokens}


def test_shared_prefix_shares_exactly_512_tokens():
    requests = make_workload("shared-prefix").requests
    prefix = requests[0].prompt_token_ids[:512]
    assert all(r.prompt_token_ids[:512] == prefix for r in requests)
    # The own parts differ already at their first token (no longer common prefix).
    assert len({r.prompt_token_ids[512] for r in requests}) == 32


def test_chat_turns_extend_the_previous_turn():
    workload = make_workload("chat")
    assert len(workload.conversations) == 8
    assert [len(c) for c in workload.conversations] == [4] * 8
    assert sorted(i for c in workload.conversations for i in c) == list(range(32))
    for conversation in workload.conversations:
        first = workload.requests[conversation[0]]
        assert 32 <= len(first.prompt_token_ids) <= 96
        for before, after in itertools.pairwise(conversation):
            prev, cur = workload.requests[before], workload.requests[after]
            assert cur.prompt_token_ids[: len(prev.prompt_token_ids)] == prev.prompt_token_ids
            new_user = len(cur.prompt_token_ids) - len(prev.prompt_token_ids) - prev.max_tokens
            assert 32 <= new_user <= 96
        assert all(32 <= workload.requests[i].max_tokens <= 64 for i in conversation)


def test_head_cuts_requests_and_conversations():
    chat = make_workload("chat").head(6)
    assert chat.name == "chat[:6]" and len(chat.requests) == 6
    assert chat.conversations == ((0, 1, 2, 3), (4, 5))
    assert make_workload("decode").head(100).name == "decode"


def test_resolve_names_all_and_files(tmp_path):
    assert [w.name for w in resolve_workloads("all")] == list(WORKLOADS)
    make_workload("decode", seed=9).save(tmp_path / "d.json")
    (loaded,) = resolve_workloads(str(tmp_path / "d.json"))
    assert loaded == make_workload("decode", seed=9)
    cut = resolve_workloads("all", num_requests=2)
    assert [w.name for w in cut] == [f"{name}[:2]" for name in WORKLOADS]
    with pytest.raises(ValueError, match="neither a workload"):
        resolve_workloads("nonsense")


def test_workloads_share_no_prompt_block():
    # Several workloads run in one engine: none may hit the cache on another's blocks.
    blocks = {}
    for name in WORKLOADS:
        for request in make_workload(name).requests:
            ids = request.prompt_token_ids
            for start in range(0, len(ids) - 15, 16):
                owner = blocks.setdefault(tuple(ids[: start + 16]), name)
                assert owner == name, f"{name} shares a prompt block with {owner}"


def test_capped_keeps_prompts_and_cuts_outputs():
    from bench.workloads import make_workload

    full = make_workload("chat", 0, 512)
    cut = full.head(6).capped(16)
    assert cut.name == "chat[:6,<=16]"
    assert [r.prompt_token_ids for r in cut.requests] == [
        r.prompt_token_ids for r in full.requests[:6]
    ]
    assert [r.max_tokens for r in cut.requests] == [
        min(16, r.max_tokens) for r in full.requests[:6]
    ]
    assert cut.conversations == full.head(6).conversations
    assert make_workload("decode", 0, 512).capped(8).name == "decode[<=8]"
