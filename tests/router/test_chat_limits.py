"""A chat's limits, before its template runs and before its prompt is tokenized:
the message count (--max-chat-messages), the contents' characters, and the
rendered prompt's characters (tool calls and names reach the prompt too)."""

from __future__ import annotations

import asyncio

import pytest

from router.errors import ContextLengthError
from router.limits import RequestLimits
from router.model import ModelContext, ModelLimits
from router.text.chat_template import ChatTemplate
from shared.errors import InvalidRequestError

# Renders each message's name too, as templates with tool calls render their arguments.
TEMPLATE = "{% for m in messages %}{{ m['role'] }}{{ m.get('name', '') }}: {{ m['content'] }}\n{% endfor %}"


@pytest.fixture
def model(tokenizer):
    limits = RequestLimits(
        max_model_len=256, max_prompt_chars=1000, max_tokens_per_request=1 << 20,
        max_chat_messages=4,
    )  # fmt: skip
    context = ModelContext(
        "tiny", ModelLimits(256, tokenizer.vocab_size, 20), tokenizer,
        ChatTemplate(TEMPLATE, {}), 1, request_limits=limits,
    )  # fmt: skip
    yield context
    context.close()


def render(model: ModelContext, messages: list[dict]) -> str:
    return asyncio.run(model.render_chat(messages, add_generation_prompt=False))[0]


def test_a_chat_within_the_limits_renders(model):
    messages = [{"role": "user", "content": "hi"}] * 4
    assert render(model, messages) == "user: hi\n" * 4


def test_more_messages_than_max_chat_messages_is_a_400_before_rendering(model):
    with pytest.raises(InvalidRequestError) as caught:
        render(model, [{"role": "user", "content": ""}] * 5)
    assert caught.value.field == "messages"
    assert "at most 4 messages per request (--max-chat-messages), got 5" in str(caught.value)


def test_contents_longer_than_max_prompt_chars_are_refused_before_rendering(model):
    with pytest.raises(ContextLengthError, match="1001 characters"):
        render(model, [{"role": "user", "content": "x" * 1001}])


def test_text_the_contents_do_not_count_is_bounded_in_the_rendered_prompt(model):
    # 10 characters of content, 2,000 of name: refused before tokenizing.
    with pytest.raises(ContextLengthError, match="--max-prompt-chars") as caught:
        render(model, [{"role": "user", "name": "n" * 2000, "content": "0123456789"}])
    assert caught.value.field == "messages"
