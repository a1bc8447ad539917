"""Rendering a conversation with the model's Jinja chat template.

Templates come from the Hub, so they are untrusted code: they run in Jinja's
immutable sandbox, with the same environment `transformers` gives them
(trim_blocks, lstrip_blocks, loop controls, `raise_exception`, a `tojson` that
does not escape HTML, `strftime_now`), so a template renders here exactly as
it does in `apply_chat_template`.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from shared.errors import InvalidRequestError


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str | None]) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self.source = source
        self._template = env.from_string(source)
        self._special_tokens = {k: v for k, v in special_tokens.items() if v is not None}

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text. The template writes the special tokens itself (BOS and the
        turn markers), so it is tokenized without adding any. `tools` and the request's
        chat_template_kwargs (e.g. Qwen3's enable_thinking) reach it as in
        `apply_chat_template(tools=..., **kwargs)`."""
        try:
            return self._template.render(
                **self._special_tokens,
                **(template_kwargs or {}),
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
            )
        except jinja2.exceptions.TemplateError as exc:
            # The template refusing a conversation (e.g. roles that do not alternate).
            raise InvalidRequestError("messages", f"the chat template refused them: {exc}") from exc
