"""Random-weight Hugging Face checkpoints of the supported architectures.

Tests build tiny ones (the correctness oracle is `transformers` itself) and
benchmarks build real-sized ones; nothing is downloaded. Each folder is what
a Hub checkpoint holds: config.json, generation_config.json, safetensors and
a byte-level BPE tokenizer with a ChatML chat template.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_TOKEN_ID = 2  # <|im_end|>
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. Pagoda serves language models.",
    "Paged attention stores keys and values in fixed-size blocks of tokens.",
    "Continuous batching lets new requests join while others are decoding.",
    "A prefix cache shares the blocks of prompts that start the same way.",
    "Café, naïve, résumé, jalapeño: accents take two bytes in UTF-8.",
    "中文字符需要三个字节。日本語もそうです。한국어도 마찬가지입니다.",
    "Emoji need four bytes: 🚀🐍✨🎉 and numbers like 3.14159 and 2026.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "user: hello there! assistant: hi, how can I help you today?",
]

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")

SMOLLM2_135M_SHAPE = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
)


def _config(arch: str, **overrides: Any):
    import transformers

    cls = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
    }[arch]
    fields = dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=0,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    if arch in ("qwen2", "qwen3"):
        fields.update(sliding_window=None, use_sliding_window=False)
    if arch == "mistral":
        fields["sliding_window"] = None
    if arch == "qwen3":
        fields["head_dim"] = 16
    fields.update(overrides)
    return cls(**fields)


def build_tokenizer(path: Path, vocab_size: int) -> None:
    """Train a byte-level BPE of exactly `vocab_size` entries and save it to `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    missing = vocab_size - tok.get_vocab_size()
    if missing > 0:  # pad so every id a random model emits decodes
        tok.add_tokens([f"<|filler_{i}|>" for i in range(missing)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(path))


def build_random_checkpoint(
    path: str | Path,
    arch: str = "llama",
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    initializer_range: float = 0.08,
    with_tokenizer: bool = True,
    max_shard_size: str | None = None,
    **config_overrides: Any,
) -> Path:
    """Write a seeded random-weight checkpoint of `arch` to `path` and return it."""
    import transformers

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = _config(arch, initializer_range=initializer_range, **config_overrides)
    model_cls = {
        "llama": transformers.LlamaForCausalLM,
        "mistral": transformers.MistralForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "qwen3": transformers.Qwen3ForCausalLM,
    }[arch]
    torch.manual_seed(seed)
    model = model_cls(config).to(dtype)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(path), **kwargs)
    generation = {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id}
    (path / "generation_config.json").write_text(json.dumps(generation))
    if with_tokenizer:
        build_tokenizer(path, config.vocab_size)
    return path
