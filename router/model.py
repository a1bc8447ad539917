"""The served model as the router sees it: name, limits, tokenizer, chat template.

Built once, when the first worker of the model announces itself (the
tokenizer is loaded in a thread meanwhile). Tokenizing and template
rendering run in a small thread pool: a long prompt must never stall the
event loop that streams every other request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from router.config import RouterConfig
from router.errors import ContextLengthError
from router.limits import RequestLimits
from router.text.chat_template import ChatTemplate
from router.text.tokenizer import Tokenizer, read_chat_template
from shared.errors import InvalidRequestError
from shared.proto.pagoda.v1 import sampling_pb2
from shared.proto.pagoda.worker.v1 import worker_pb2 as wpb


@dataclass(frozen=True)
class ModelLimits:
    max_model_len: int
    vocab_size: int
    max_logprobs: int


class ModelContext:
    def __init__(
        self,
        name: str,
        limits: ModelLimits,
        tokenizer: Tokenizer,
        chat_template: ChatTemplate | None,
        num_threads: int,
        default_sampling_params: sampling_pb2.SamplingParams | None = None,
        root: str | None = None,
        request_limits: RequestLimits | None = None,
    ) -> None:
        self.name = name
        self.root = root or name  # the checkpoint the workers loaded
        self.limits = limits
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        # The model's recommended values for fields a request leaves unset.
        self.default_sampling_params = default_sampling_params or sampling_pb2.SamplingParams()
        self.request_limits = request_limits or RequestLimits.for_model(
            limits.max_model_len, tokenizer.longest_token_chars, None, 1 << 62
        )
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix="pagoda-tokenize")

    @classmethod
    def load(cls, info: wpb.GetModelInfoResponse, config: RouterConfig) -> ModelContext:
        """Blocking (reads tokenizer files, maybe downloads them): run it in a thread."""
        tokenizer = Tokenizer.load(config.tokenizer or info.tokenizer or info.model)
        source = (
            read_chat_template(config.chat_template)
            if config.chat_template
            else tokenizer.chat_template
        )
        template = None
        if source is not None:
            specials = {"bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token}
            template = ChatTemplate(source, specials)
        limits = ModelLimits(info.max_model_len, info.vocab_size, info.max_logprobs)
        request_limits = RequestLimits.for_model(
            info.max_model_len,
            tokenizer.longest_token_chars,
            config.max_prompt_chars,
            config.max_tokens_per_request,
            config.max_chat_messages,
        )
        return cls(
            info.served_model_name,
            limits,
            tokenizer,
            template,
            config.tokenizer_threads,
            info.default_sampling_params,
            request_limits=request_limits,
            root=info.model,
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def encode(
        self, text: str, add_special_tokens: bool = True, what: str = "prompt"
    ) -> list[int]:
        self.request_limits.check_prompt_chars(len(text), what)
        return await self._run(self.tokenizer.encode, text, add_special_tokens)

    async def render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        add_special_tokens: bool = False,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> tuple[str, list[int]]:
        """The conversation as prompt text and token ids."""
        if self.chat_template is None:
            raise InvalidRequestError(
                "messages",
                "this model's tokenizer has no chat template; start the router with "
                "--chat-template, or use /v1/completions",
            )
        template, limits = self.chat_template, self.request_limits
        limits.check_messages(len(messages))
        limits.check_prompt_chars(_content_chars(messages), "messages")

        def render() -> tuple[str, list[int]]:
            text = template.render(messages, add_generation_prompt, tools, template_kwargs)
            # Tool calls, tool definitions, names: what the contents did not count.
            limits.check_prompt_chars(len(text), "messages")
            # The template wrote the special tokens (BOS, turn markers) itself, so the
            # tokenizer adds its own only when asked (vLLM's add_special_tokens).
            return text, self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

        return await self._run(render)

    def check_prompt(
        self, prompt_token_ids: Sequence[int], max_tokens: int | None, what: str
    ) -> int:
        """Check token ids and length against the model; return the effective max_tokens.
        `what` names the prompt in messages ("prompt" or "messages")."""
        if not prompt_token_ids:
            raise InvalidRequestError(
                what, "the prompt is empty: it must contain at least one token"
            )
        vocab = self.limits.vocab_size
        bad = next((t for t in prompt_token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequestError(
                what, f"token id {bad} is outside the vocabulary [0, {vocab})"
            )
        num_prompt, limit = len(prompt_token_ids), self.limits.max_model_len
        if num_prompt >= limit:
            raise ContextLengthError(
                what,
                f"this model's maximum context length is {limit} tokens, but the {what} has "
                f"{num_prompt} tokens, which leaves no room to generate; shorten it to at most "
                f"{limit - 1} tokens",
            )
        if max_tokens is None:
            return limit - num_prompt
        if num_prompt + max_tokens > limit:
            raise ContextLengthError(
                what,
                f"this model's maximum context length is {limit} tokens, but you requested "
                f"{num_prompt + max_tokens} tokens ({num_prompt} in the {what}, {max_tokens} for "
                f"the completion); lower max_tokens to at most {limit - num_prompt} or shorten "
                f"the {what}",
            )
        return max_tokens


def _content_chars(messages: list[dict[str, Any]]) -> int:
    """Characters of the text the messages carry (string contents and text parts)."""
    total = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(p.get("text") or "") for p in content if isinstance(p, dict))
    return total
