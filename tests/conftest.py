"""Session fixtures: tiny random checkpoints, and `transformers` as the oracle."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.checkpoints import build_random_checkpoint


@pytest.fixture(scope="session")
def make_checkpoint(tmp_path_factory):
    """make_checkpoint(arch, **overrides) -> folder; each distinct one is built once."""
    built: dict[tuple, Path] = {}

    def make(arch: str = "llama", **overrides) -> Path:
        key = (arch, tuple(sorted((k, str(v)) for k, v in overrides.items())))
        if key not in built:
            built[key] = build_random_checkpoint(tmp_path_factory.mktemp(arch), arch, **overrides)
        return built[key]

    return make


@pytest.fixture(scope="session")
def hf_greedy():
    """hf_greedy(path, prompts, max_new_tokens) -> generated ids per prompt, one at a time."""
    from transformers import AutoModelForCausalLM

    models: dict[Path, torch.nn.Module] = {}
    memo: dict[tuple, list[int]] = {}

    def generate(path: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        if path not in models:
            models[path] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        model = models[path]
        results = []
        for prompt in prompts:
            key = (path, tuple(prompt), max_new_tokens)
            if key not in memo:
                with torch.no_grad():
                    out = model.generate(
                        torch.tensor([prompt]),
                        max_new_tokens=max_new_tokens,
                        do_sample=False,
                        pad_token_id=0,
                    )
                memo[key] = out[0, len(prompt) :].tolist()
            results.append(memo[key])
        return results

    return generate


def random_prompts(lengths: list[int], vocab_size: int = 512, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    # Ids from 3 up: 0-2 are special tokens.
    return [torch.randint(3, vocab_size, (n,), generator=generator).tolist() for n in lengths]
