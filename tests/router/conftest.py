"""Router test fixtures: the tiny checkpoint's tokenizer, and `pagoda serve` with two
workers (the in-process affinity store, an API key), shared by the whole session."""

from __future__ import annotations

from dataclasses import dataclass

import openai
import pytest

from router.text.tokenizer import Tokenizer
from tests.cluster import ENGINE_FLAGS, RouterProcess, start_router, wait_serving

API_KEY = "test-key"
MODEL = "tiny"


@pytest.fixture(scope="session")
def tokenizer(make_checkpoint) -> Tokenizer:
    return Tokenizer.load(str(make_checkpoint("llama")))


@dataclass
class Served:
    router: RouterProcess

    @property
    def base_url(self) -> str:
        return self.router.base_url

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {API_KEY}"}

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=API_KEY, max_retries=0)

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="session")
def served(make_checkpoint, tmp_path_factory):
    """`pagoda serve` with two workers; no Redis (its embedded store)."""
    args = [str(make_checkpoint("llama")), "--num-workers=2", f"--served-model-name={MODEL}"]
    args += [f"--api-key={API_KEY}", *ENGINE_FLAGS]
    router = start_router("serve", args, tmp_path_factory.mktemp("serve") / "serve.log")
    try:
        wait_serving(router.process, router.base_url, 2)
        yield Served(router)
    finally:
        router.process.stop()
