"""Benchmark workloads: token-id requests generated deterministically from a seed.

A workload is plain data every engine can run the same way (ours offline or
served, `transformers`, vLLM): each request is prompt token ids and an exact
output length, and EOS is ignored, so every engine does the same work. The
JSON form is a contract other runners read (bench/vllm_reference.py):

    {"name": str, "seed": int, "vocab_size": int,
     "requests": [{"prompt_token_ids": [int, ...], "max_tokens": int}, ...],
     "conversations": [[request_index, ...], ...]}      # `chat` only, turn by turn

Token ids are drawn uniformly from [FIRST_TOKEN_ID, vocab_size): the low ids are
special tokens in the checkpoints we build (and in most real vocabularies).
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

FIRST_TOKEN_ID = 16
DEFAULT_VOCAB_SIZE = 49152  # SmolLM2's


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: tuple[int, ...]
    max_tokens: int


@dataclass(frozen=True)
class Workload:
    name: str
    seed: int
    vocab_size: int
    requests: tuple[BenchRequest, ...]
    # Chat only: per conversation, its requests' indexes in turn order. A turn's
    # prompt extends the previous turn's, so a server sends it after that one ends.
    conversations: tuple[tuple[int, ...], ...] | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(r.prompt_token_ids) for r in self.requests)

    @property
    def num_output_tokens(self) -> int:
        return sum(r.max_tokens for r in self.requests)

    def head(self, num_requests: int) -> Workload:
        """The first `num_requests` requests (a quick cut), named `name[:n]`."""
        if num_requests >= len(self.requests):
            return self
        conversations = None
        if self.conversations is not None:
            kept = (tuple(i for i in c if i < num_requests) for c in self.conversations)
            conversations = tuple(c for c in kept if c)
        return Workload(
            f"{self.name}[:{num_requests}]",
            self.seed,
            self.vocab_size,
            self.requests[:num_requests],
            conversations,
        )

    def capped(self, max_tokens: int) -> Workload:
        """Every request's max_tokens cut to at most `max_tokens`, named `name[..,<=n]`
        (a smoke test's workload: fewer decode steps; the prompts are unchanged)."""
        requests = tuple(
            BenchRequest(r.prompt_token_ids, min(r.max_tokens, max_tokens)) for r in self.requests
        )
        name = (
            f"{self.name[:-1]},<={max_tokens}]"
            if self.name.endswith("]")
            else f"{self.name}[<={max_tokens}]"
        )
        return Workload(name, self.seed, self.vocab_size, requests, self.conversations)

    def to_json(self) -> dict:
        data = {
            "name": self.name,
            "seed": self.seed,
            "vocab_size": self.vocab_size,
            "requests": [
                {"prompt_token_ids": list(r.prompt_token_ids), "max_tokens": r.max_tokens}
                for r in self.requests
            ],
        }
        if self.conversations is not None:
            data["conversations"] = [list(c) for c in self.conversations]
        return data

    @classmethod
    def from_json(cls, data: dict) -> Workload:
        requests = tuple(
            BenchRequest(tuple(r["prompt_token_ids"]), r["max_tokens"]) for r in data["requests"]
        )
        conversations = data.get("conversations")
        return cls(
            data["name"],
            data["seed"],
            data["vocab_size"],
            requests,
            None if conversations is None else tuple(tuple(c) for c in conversations),
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json()))

    @classmethod
    def load(cls, path: str | Path) -> Workload:
        return cls.from_json(json.loads(Path(path).read_text()))


class TokenDraw:
    """Seeded draws. `random.Random` with an int seed gives the same stream on every
    platform and Python version we support, and needs neither numpy nor torch.
    Each workload draws from its own stream (the seed mixed with the workload's
    name): on one seed's shared stream, every workload's first prompt began with
    the same tokens, so a run of several workloads in one engine hit the prefix
    cache across workloads."""

    def __init__(self, seed: int, vocab_size: int, stream: str = "") -> None:
        if vocab_size <= FIRST_TOKEN_ID:
            raise ValueError(f"vocab_size must exceed {FIRST_TOKEN_ID}, got {vocab_size}")
        self.rng = random.Random(seed * 2**32 + zlib.crc32(stream.encode()))
        self.vocab_size = vocab_size

    def tokens(self, num_tokens: int) -> tuple[int, ...]:
        return tuple(self.rng.randrange(FIRST_TOKEN_ID, self.vocab_size) for _ in range(num_tokens))

    def length(self, bounds: tuple[int, int]) -> int:
        return self.rng.randint(*bounds)  # both ends included


def mixed(
    draw: TokenDraw,
    num_requests: int = 64,
    prompt_len: tuple[int, int] = (16, 256),
    output_len: tuple[int, int] = (16, 128),
) -> list[BenchRequest]:
    """Independent requests of uniformly drawn prompt and output lengths."""
    requests = []
    for _ in range(num_requests):
        prompt = draw.tokens(draw.length(prompt_len))
        requests.append(BenchRequest(prompt, draw.length(output_len)))
    return requests


def fixed(
    draw: TokenDraw, num_requests: int, prompt_len: int, output_len: int
) -> list[BenchRequest]:
    return [BenchRequest(draw.tokens(prompt_len), output_len) for _ in range(num_requests)]


def shared_prefix(
    draw: TokenDraw,
    num_requests: int = 32,
    prefix_len: int = 512,
    suffix_len: int = 32,
    output_len: int = 32,
) -> list[BenchRequest]:
    """One common prefix (a long system prompt), then each request's own tokens."""
    prefix = draw.tokens(prefix_len)
    return [BenchRequest(prefix + draw.tokens(suffix_len), output_len) for _ in range(num_requests)]


def chat(
    draw: TokenDraw,
    num_conversations: int = 8,
    num_turns: int = 4,
    user_len: tuple[int, int] = (32, 96),
    output_len: tuple[int, int] = (32, 64),
) -> tuple[list[BenchRequest], list[tuple[int, ...]]]:
    """Multi-turn conversations. A turn's prompt is the previous turn's prompt, a fixed
    synthetic assistant reply as long as that turn's output, and new user tokens:

        turn k prompt = turn k-1 prompt | reply (turn k-1 max_tokens) | user tokens

    Engines with random weights say something else, but the prefix a server can reuse
    is the same for all of them. Requests are listed conversation by conversation."""
    requests: list[BenchRequest] = []
    conversations = []
    for _ in range(num_conversations):
        indexes = []
        prompt: tuple[int, ...] = ()
        for turn in range(num_turns):
            if turn:
                prompt = prompt + draw.tokens(requests[-1].max_tokens)
            prompt = prompt + draw.tokens(draw.length(user_len))
            indexes.append(len(requests))
            requests.append(BenchRequest(prompt, draw.length(output_len)))
        conversations.append(tuple(indexes))
    return requests, conversations


_GENERATORS: dict[str, Callable[[TokenDraw], list[BenchRequest]]] = {
    "mixed": mixed,
    "decode": lambda draw: fixed(draw, num_requests=32, prompt_len=32, output_len=128),
    "prefill": lambda draw: fixed(draw, num_requests=16, prompt_len=1024, output_len=1),
    "shared-prefix": shared_prefix,
}
WORKLOADS = (*_GENERATORS, "chat")


def make_workload(name: str, seed: int = 0, vocab_size: int = DEFAULT_VOCAB_SIZE) -> Workload:
    """The named workload at its standard size."""
    draw = TokenDraw(seed, vocab_size, stream=name)
    if name == "chat":
        requests, conversations = chat(draw)
        return Workload(name, seed, vocab_size, tuple(requests), tuple(conversations))
    if name not in _GENERATORS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    return Workload(name, seed, vocab_size, tuple(_GENERATORS[name](draw)))


def resolve_workloads(
    spec: str,
    seed: int = 0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    num_requests: int | None = None,
) -> list[Workload]:
    """`--workload` values: a name, `all`, or the path of a workload JSON file; each
    cut to its first `num_requests` requests when given (`--num-requests`)."""
    if spec == "all":
        workloads = [make_workload(name, seed, vocab_size) for name in WORKLOADS]
    elif spec in WORKLOADS:
        workloads = [make_workload(spec, seed, vocab_size)]
    elif Path(spec).is_file():
        workloads = [Workload.load(spec)]
    else:
        raise ValueError(
            f"--workload {spec!r} is neither a workload ({', '.join(WORKLOADS)}, all) "
            "nor a workload JSON file"
        )
    return [w.head(num_requests) if num_requests else w for w in workloads]
