"""vLLM's request fields through the official openai client, each checked for its effect.

Most run against the session's `pagoda serve` (two workers). `special` is a
`pagoda serve` of its own over a copy of the tiny checkpoint whose tokenizer
adds a BOS token and spaces out added tokens when decoding (WordPiece's
decoder), whose generation_config.json recommends greedy sampling and 5 new
tokens, and whose single worker runs one sequence at a time under
`--scheduling-policy priority`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time

import openai
import pytest
import torch

from router.text.tokenizer import Tokenizer
from tests.cluster import ENGINE_FLAGS
from tests.router.conftest import MODEL, serving

PROMPT = "The pagoda stood on the hill and"
BOS = "<|endoftext|>"


def completion_ids(choice) -> list[int]:
    """Token ids of a choice asked with logprobs and return_tokens_as_token_ids."""
    return [int(t.removeprefix("token_id:")) for t in choice.logprobs.tokens]


@pytest.fixture(scope="module")
def special_checkpoint(make_checkpoint, tmp_path_factory):
    folder = tmp_path_factory.mktemp("special") / "model"
    shutil.copytree(make_checkpoint("llama"), folder)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    bos_id = next(t["id"] for t in tokenizer["added_tokens"] if t["content"] == BOS)
    tokenizer["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": BOS, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {BOS: {"id": BOS, "ids": [bos_id], "tokens": [BOS]}},
    }
    tokenizer["decoder"] = {"type": "WordPiece", "prefix": "##", "cleanup": False}
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    generation = json.loads((folder / "generation_config.json").read_text())
    generation.update(temperature=0.0, max_new_tokens=5)
    (folder / "generation_config.json").write_text(json.dumps(generation))
    return folder


@pytest.fixture(scope="module")
def special(special_checkpoint, tmp_path_factory):
    args = [str(special_checkpoint), f"--served-model-name={MODEL}", *ENGINE_FLAGS]
    args += ["--scheduling-policy=priority", "--max-num-seqs=1"]
    with serving(args, tmp_path_factory.mktemp("special") / "serve.log", 1) as served:
        yield served


@pytest.mark.parametrize("stream", [False, True])
def test_the_sampled_token_is_among_top_logprobs_at_temperature_one(served, stream):
    client = served.client()
    kwargs = dict(model=MODEL, temperature=1.0, seed=11, max_tokens=24, stream=stream)
    # Token ids as keys: several byte pieces decode to the same text ("\ufffd").
    completion = client.completions.create(
        prompt=PROMPT, logprobs=2, extra_body={"return_tokens_as_token_ids": True}, **kwargs
    )
    chat = client.chat.completions.create(
        messages=[{"role": "user", "content": PROMPT}], logprobs=True, top_logprobs=2, **kwargs
    )
    if stream:
        tokens, tops = [], []
        for chunk in completion:
            if chunk.choices and chunk.choices[0].logprobs is not None:
                tokens += chunk.choices[0].logprobs.tokens
                tops += chunk.choices[0].logprobs.top_logprobs
        content = [
            e
            for c in chat
            if c.choices and c.choices[0].logprobs
            for e in c.choices[0].logprobs.content
        ]
    else:
        tokens = completion.choices[0].logprobs.tokens
        tops = completion.choices[0].logprobs.top_logprobs
        content = chat.choices[0].logprobs.content
    assert len(tokens) == 24 and len(content) == 24
    outside = 0
    for token, top in zip(tokens, tops):
        assert token in top and 2 <= len(top) <= 3
        outside += len(top) == 3
    for entry in content:
        alternatives = [t.token for t in entry.top_logprobs]
        assert entry.token in alternatives and 2 <= len(alternatives) <= 3
        outside += len(alternatives) == 3
    # At temperature 1 on a random model the draw often leaves the top two.
    assert outside > 0


def test_return_tokens_as_token_ids_names_each_token_by_id(served, tokenizer):
    choice = served.client().completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=1,
        extra_body={"return_tokens_as_token_ids": True},
    ).choices[0]  # fmt: skip
    assert all(t.startswith("token_id:") for t in choice.logprobs.tokens)
    assert tokenizer.decode(completion_ids(choice)) == choice.text
    assert all(k.startswith("token_id:") for top in choice.logprobs.top_logprobs for k in top)


def test_allowed_token_ids_restrict_every_draw(served, tokenizer):
    allowed = tokenizer.encode(" pagoda hill")
    choice = served.client().completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=16, temperature=1.0, seed=3, logprobs=0,
        extra_body={"allowed_token_ids": allowed, "return_tokens_as_token_ids": True},
    ).choices[0]  # fmt: skip
    ids = completion_ids(choice)
    assert len(ids) == 16 and set(ids) <= set(allowed)
    assert len(set(ids)) > 1  # not one token forced by chance


def contains(ids: list[int], seq: list[int]) -> bool:
    return any(ids[i : i + len(seq)] == seq for i in range(len(ids)))


def bad_word_sequences(tokenizer, word: str) -> list[list[int]]:
    """How the router tokenizes a bad word (as vLLM does): alone, and after a space
    when that is another token sequence of the same length."""
    plain = tokenizer.encode(word.lstrip(), False)
    spaced = tokenizer.encode(" " + word.lstrip(), False)
    return [plain] + ([spaced] if spaced[0] != plain[0] and len(spaced) == len(plain) else [])


def test_bad_words_are_never_generated(served, tokenizer):
    """Draws restricted to a word's tokens and one other: the word keeps coming up,
    until it is a bad word."""
    word = "fox"
    sequences = bad_word_sequences(tokenizer, word)
    pieces = sorted({t for seq in sequences for t in seq})
    assert any(len(seq) > 1 for seq in sequences)  # the ban depends on the output so far
    allowed = [*pieces, tokenizer.encode(" hill", False)[0]]
    kwargs = dict(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=1.0, seed=7, logprobs=0)
    extra = {"return_tokens_as_token_ids": True, "allowed_token_ids": allowed}
    free = completion_ids(client_choice(served, kwargs, extra))
    banned = completion_ids(client_choice(served, kwargs, {**extra, "bad_words": [word]}))
    assert any(contains(free, seq) for seq in sequences)
    assert not any(contains(banned, seq) for seq in sequences)
    assert set(banned) & set(pieces)  # the word's tokens still come, just not in order


def client_choice(served, kwargs, extra):
    return served.client().completions.create(**kwargs, extra_body=extra).choices[0]


def test_prompt_logprobs_are_the_models_own(served, tokenizer, make_checkpoint):
    from transformers import AutoModelForCausalLM

    prompt_ids = tokenizer.encode(PROMPT)
    choice = served.client().completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0,
        extra_body={"prompt_logprobs": 1},
    ).choices[0]  # fmt: skip
    entries = choice.model_extra["prompt_logprobs"]
    assert len(entries) == len(prompt_ids) and entries[0] is None
    model = AutoModelForCausalLM.from_pretrained(make_checkpoint("llama"), dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids])).logits[0].float()
    expected = torch.log_softmax(logits, dim=-1)
    for position, entry in enumerate(entries[1:], start=1):
        token = prompt_ids[position]
        assert set(entry) >= {str(token)} and len(entry) <= 2
        assert entry[str(token)]["logprob"] == pytest.approx(
            expected[position - 1, token].item(), abs=1e-4
        )
        best = int(expected[position - 1].argmax())
        assert entry[str(best)]["rank"] == 1


def test_truncate_prompt_tokens_keeps_the_prompts_tail(served, tokenizer):
    client = served.client()
    prompt_ids = tokenizer.encode(PROMPT)
    cut = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0,
        extra_body={"truncate_prompt_tokens": 4},
    )  # fmt: skip
    tail = client.completions.create(
        model=MODEL, prompt=prompt_ids[-4:], max_tokens=6, temperature=0
    )
    assert cut.usage.prompt_tokens == 4
    assert cut.choices[0].text == tail.choices[0].text


def test_min_tokens_holds_stop_strings_back_until_reached(served):
    client = served.client()
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0)
    text = plain.choices[0].text
    assert len(text) >= 5
    stop = text[2:5]
    early = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, stop=[stop]
    )
    held = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, stop=[stop],
        extra_body={"min_tokens": 20, "ignore_eos": True},
    )  # fmt: skip
    assert early.choices[0].finish_reason == "stop" and len(early.choices[0].text) <= 2
    # Past the stop string, to the 20 tokens asked for.
    assert held.usage.completion_tokens == 20
    assert held.choices[0].text.startswith(text[:5])


def streamed(stream) -> tuple[str, int]:
    """A completions stream's text and how many chunks carried some of it."""
    pieces = [c.choices[0].text for c in stream if c.choices and c.choices[0].text]
    return "".join(pieces), len(pieces)


def test_stream_interval_sends_the_same_text_in_fewer_chunks(served):
    client = served.client()
    ask = dict(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stream=True)
    plain, held = {"ignore_eos": True}, {"ignore_eos": True, "stream_interval": 8}
    every, every_chunks = streamed(client.completions.create(**ask, extra_body=plain))
    text, chunks = streamed(client.completions.create(**ask, extra_body=held))
    assert text == every
    # 24 tokens: the first at once, then 8, 8 and the last 7 with the finish.
    assert chunks <= 4 < every_chunks
    # A stop string inside a held run still ends the text where it starts.
    stop = every[6:9]
    whole = client.completions.create(**{**ask, "stream": False}, stop=[stop], extra_body=plain)
    cut, _ = streamed(client.completions.create(**ask, stop=[stop], extra_body=held))
    assert cut == whole.choices[0].text == every[: every.index(stop)]
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=12, temperature=0,
        stream=True, extra_body={"ignore_eos": True, "stream_interval": 5},
    )  # fmt: skip
    # 12 tokens: 1, then 5, 5 and the last one.
    assert sum(1 for c in chat if c.choices and c.choices[0].delta.content) <= 4


@pytest.mark.parametrize(
    "endpoint, body, field",
    [
        ("chat", {"temperature": 2.5}, "temperature"),
        ("completions", {"temperature": 2.5}, "temperature"),
        ("chat", {"top_p": 1.5}, "top_p"),
        ("completions", {"presence_penalty": -3}, "presence_penalty"),
        ("chat", {"frequency_penalty": 2.1}, "frequency_penalty"),
        ("chat", {"n": 129}, "n"),
        ("completions", {"n": 0}, "n"),
        ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("completions", {"logprobs": 21}, "logprobs"),
        ("completions", {"logit_bias": {"5": 101}}, "logit_bias"),
        ("completions", {"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ("completions", {"allowed_token_ids": [5, 10**6]}, "allowed_token_ids"),
        ("chat", {"stream_interval": 0}, "stream_interval"),
    ],
)
def test_value_ranges_are_openais_on_both_endpoints(served, endpoint, body, field):
    client = served.client()
    with pytest.raises(openai.BadRequestError) as info:
        if endpoint == "chat":
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                extra_body=body,
            )  # fmt: skip
        else:
            client.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body=body)
    error = info.value.body
    assert error["param"] == field and error["message"].startswith(f"{field}: ")


def test_chat_echo_continues_the_last_assistant_message(served):
    messages = [
        {"role": "user", "content": "Tell me a story."},
        {"role": "assistant", "content": "Once upon a time"},
    ]
    kwargs = dict(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    extra = {"echo": True, "add_generation_prompt": False}
    whole = served.client().chat.completions.create(**kwargs, extra_body=extra)
    plain = served.client().chat.completions.create(
        **kwargs, extra_body={"add_generation_prompt": False}
    )
    assert whole.choices[0].message.content == "Once upon a time" + plain.choices[0].message.content
    chunks = list(served.client().chat.completions.create(**kwargs, extra_body=extra, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content


def test_add_special_tokens_adds_the_tokenizers_bos(special, special_checkpoint):
    tokenizer = Tokenizer.load(str(special_checkpoint))
    client = special.client()
    plain_ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    with_bos = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1)
    without = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=1, extra_body={"add_special_tokens": False}
    )
    assert with_bos.usage.prompt_tokens == len(plain_ids) + 1
    assert without.usage.prompt_tokens == len(plain_ids)
    messages = [{"role": "user", "content": "hi"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    chat_bos = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=1, extra_body={"add_special_tokens": True}
    )
    assert chat_bos.usage.prompt_tokens == chat.usage.prompt_tokens + 1


def test_spaces_between_special_tokens(special, special_checkpoint):
    tokenizer = Tokenizer.load(str(special_checkpoint))
    specials = [tokenizer.backend.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>")]
    texts = {}
    for spaces in (True, False):
        choice = special.client().completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=4, temperature=1.0, seed=1,
            extra_body={
                "allowed_token_ids": specials, "skip_special_tokens": False, "ignore_eos": True,
                "spaces_between_special_tokens": spaces,
            },
        ).choices[0]  # fmt: skip
        texts[spaces] = choice.text
    assert " " not in texts[False] and texts[True].replace(" ", "") == texts[False]
    assert texts[True].count(" ") >= 3


def test_generation_config_supplies_the_defaults(special):
    client = special.client()
    # The model recommends greedy and 5 new tokens: a request that says nothing gets both.
    default = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8)
    greedy = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    assert default.choices[0].text == greedy.choices[0].text
    hot = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=5
    )
    assert hot.choices[0].text != greedy.choices[0].text
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], extra_body={"ignore_eos": True}
    )
    assert chat.usage.completion_tokens == 5


def test_priority_reorders_a_saturated_workers_queue(special):
    """One sequence at a time: while a long request runs, a low-priority one and then a
    high-priority one queue; the high-priority one starts first."""

    async def first_token_time(client, priority: int, max_tokens: int, started: list) -> float:
        stream = await client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=max_tokens, temperature=0, stream=True,
            extra_body={"priority": priority, "ignore_eos": True},
        )  # fmt: skip
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                started.append(priority)
                break
        async for _ in stream:
            pass
        return time.monotonic()

    async def trial() -> tuple[list[int], float]:
        """The order the three started in, and how long before the long request's
        end the high-priority one was sent."""
        client = special.async_client()
        started: list[int] = []
        long = asyncio.create_task(first_token_time(client, 0, 200, started))
        while not started:
            await asyncio.sleep(0.005)
        low = asyncio.create_task(first_token_time(client, 5, 4, started))
        # Enough for low to reach the worker first (a few ms), well inside the long
        # request's remaining ~70-95 ms (200 tokens of the tiny model on a 2-core
        # machine): 50 ms here left 20-45 ms, and low sometimes started first.
        await asyncio.sleep(0.01)
        sent = time.monotonic()
        high = asyncio.create_task(first_token_time(client, -5, 4, started))
        long_end, _, _ = await asyncio.gather(long, low, high)
        return started, long_end - sent

    # On a loaded host the long request (max-model-len caps it) can end before high
    # reaches the worker's queue, and then low rightly goes first: one CI run did
    # with high sent 20-45 ms before the end, another with 91 ms (the router and
    # worker sharing 2 cores with the test run). So a trial where low went first is
    # run again; a policy that ignores priority puts low first in every one.
    margins = []
    for _ in range(5):
        order, margin = asyncio.run(trial())
        if order == [0, -5, 5]:
            return
        margins.append(round(margin * 1000, 1))
    pytest.fail(
        "low-priority started before high in 5 trials out of 5; high was sent this long "
        f"before the long request ended (ms): {margins}"
    )


def test_priority_needs_the_priority_policy(served):
    with pytest.raises(openai.BadRequestError, match="scheduling-policy priority") as info:
        served.client().completions.create(
            model=MODEL, prompt="hi", max_tokens=2, extra_body={"priority": 3}
        )
    assert info.value.body["param"] == "priority"
