"""Prefix affinity over Redis: multi-turn conversations stay with the worker that holds
them, whichever router they come through; routing by load alone caches less."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import redis

from router.text.chat_template import ChatTemplate
from shared.block_hash import block_hashes
from shared.registry import RegistryKeys, live_workers
from tests.router.conftest import MODEL

NUM_CONVERSATIONS, NUM_TURNS, BLOCK_SIZE = 8, 4, 4
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "paged",
    "attention",
    "blocks",
    "prefix",
    "cache",
]


@dataclass
class Turn:
    worker: str
    prompt_ids: list[int]
    cached_tokens: int
    seconds: float


def common_prefix_len(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def converse(cluster, tokenizer, route: Callable[[int, int], str], seed: int) -> list[list[Turn]]:
    """Conversation after conversation, turn after turn; `route(c, t)` names the router."""
    template = ChatTemplate(tokenizer.chat_template, {})
    rng = random.Random(seed)
    clients = {name: cluster.client(name) for name in cluster.routers}
    conversations = []
    for c in range(NUM_CONVERSATIONS):
        # Conversations differ from their first words on (see the policy's NOTE on
        # shared heads: a long system prompt every conversation shares is a hot prefix).
        messages = [{"role": "system", "content": f"{seed}.{c}: be brief."}]
        turns = []
        for t in range(NUM_TURNS):
            messages.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=8))})
            started = time.monotonic()
            raw = clients[route(c, t)].chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=8, temperature=0
            )
            response = raw.parse()
            prompt_ids = tokenizer.encode(template.render(messages), add_special_tokens=False)
            assert response.usage.prompt_tokens == len(prompt_ids)
            cached = response.usage.prompt_tokens_details.cached_tokens
            elapsed = time.monotonic() - started
            turns.append(Turn(raw.headers["x-pagoda-worker"], prompt_ids, cached, elapsed))
            messages.append({"role": "assistant", "content": response.choices[0].message.content})
        conversations.append(turns)
    return conversations


def later_turns_cached(conversations: list[list[Turn]]) -> int:
    return sum(turn.cached_tokens for turns in conversations for turn in turns[1:])


@pytest.fixture(scope="module")
def affinity_run(cluster, tokenizer):
    # Turns alternate between routers a and b: each follows the other's choices.
    return converse(cluster, tokenizer, lambda c, t: "ab"[(c + t) % 2], seed=1)


def test_every_later_turn_goes_to_the_worker_holding_the_conversation(affinity_run):
    for turns in affinity_run:
        assert [t.worker for t in turns] == [turns[0].worker] * NUM_TURNS
        for earlier, turn in itertools.pairwise(turns):
            shared = common_prefix_len(earlier.prompt_ids, turn.prompt_ids)
            assert shared >= len(earlier.prompt_ids) - BLOCK_SIZE  # the earlier turn is a prefix
            # Every full block of the earlier turns came from the cache.
            assert turn.cached_tokens >= shared // BLOCK_SIZE * BLOCK_SIZE
    # New conversations (cache misses) spread over both workers.
    assert len({turns[0].worker for turns in affinity_run}) == 2


def test_a_router_records_its_choice_in_redis_at_once(cluster, tokenizer, affinity_run):
    client = redis.Redis.from_url(cluster.redis.url)
    workers = {w.worker_id: w for w in live_workers(client, RegistryKeys(cluster.prefix))}
    turn = affinity_run[-1][-1]
    epoch = workers[turn.worker].epoch
    key = f"{cluster.prefix}:chosen:{turn.worker}:{epoch}"
    chain = block_hashes(turn.prompt_ids, BLOCK_SIZE)
    assert all(score is not None for score in client.zmscore(key, chain))
    assert 0 < client.pttl(key) <= 10_000  # a short TTL: workers' own records take over
    client.close()


def test_routing_by_load_alone_caches_less(cluster, tokenizer, affinity_run, capsys):
    control = converse(cluster, tokenizer, lambda c, t: "load", seed=2)
    affinity_cached, control_cached = later_turns_cached(affinity_run), later_turns_cached(control)
    prompt_tokens = sum(len(t.prompt_ids) for turns in control for t in turns[1:])
    with capsys.disabled():
        print(
            f"\n[affinity] cached prompt tokens in turns 2-{NUM_TURNS} of {NUM_CONVERSATIONS} "
            f"conversations: prefix affinity {affinity_cached}, load only {control_cached} "
            f"(of ~{prompt_tokens} prompt tokens); mean request seconds: affinity "
            f"{mean_seconds(affinity_run):.3f}, load only {mean_seconds(control):.3f}"
        )
    assert affinity_cached > control_cached
    # Load alone moves conversations between workers.
    assert any(len({t.worker for t in turns}) > 1 for turns in control)


def mean_seconds(conversations: list[list[Turn]]) -> float:
    seconds = [t.seconds for turns in conversations for t in turns]
    return sum(seconds) / len(seconds)
