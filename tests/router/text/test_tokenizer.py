"""The router's tokenizer (no transformers) against transformers' own, the oracle."""

from __future__ import annotations

import pytest

from bench.checkpoints import _CORPUS
from router.text.chat_template import ChatTemplate
from router.text.tokenizer import Tokenizer, read_chat_template
from shared.errors import ConfigError, InvalidRequestError

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Café? 中文 🚀"},
    {"role": "assistant", "content": "Oui."},
    {"role": "user", "content": "More."},
]


@pytest.fixture(scope="module")
def hf_tokenizer(make_checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(make_checkpoint("llama")))


def test_encode_and_decode_match_transformers(tokenizer, hf_tokenizer):
    for text in _CORPUS:
        ids = tokenizer.encode(text)
        assert ids == hf_tokenizer.encode(text)
        assert tokenizer.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_renders_as_transformers_does(tokenizer, hf_tokenizer, add_generation_prompt):
    template = ChatTemplate(tokenizer.chat_template, {"bos_token": tokenizer.bos_token})
    text = template.render(CONVERSATION, add_generation_prompt)
    expected = hf_tokenizer.apply_chat_template(
        CONVERSATION, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert text == expected
    expected_ids = hf_tokenizer.apply_chat_template(
        CONVERSATION, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=True
    )["input_ids"]
    assert tokenizer.encode(text, add_special_tokens=False) == list(expected_ids)


def test_token_bytes_recover_partial_characters(tokenizer):
    ids = tokenizer.encode("中文字符")
    assert b"".join(bytes(tokenizer.token_bytes(i)) for i in ids) == "中文字符".encode()


def test_a_template_that_refuses_a_conversation_is_a_bad_request():
    template = ChatTemplate("{{ raise_exception('roles must alternate') }}", {})
    with pytest.raises(InvalidRequestError, match="roles must alternate"):
        template.render(CONVERSATION)


def test_chat_template_flag_takes_a_file_or_the_template(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0]['content'] }}")
    assert read_chat_template(str(path)) == "{{ messages[0]['content'] }}"
    assert read_chat_template("{% for m in messages %}x{% endfor %}").startswith("{%")
    with pytest.raises(ConfigError, match="no such file"):
        read_chat_template(str(tmp_path / "missing.jinja"))


def test_a_folder_without_tokenizer_json_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"no tokenizer\.json"):
        Tokenizer.load(str(tmp_path))
