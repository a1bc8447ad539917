"""Compiles constraints into grammars, off the step loop, once per constraint.

```
service handler ── submit(constraint) ──► thread pool ── xgrammar ──► CompiledGrammar
      │ awaits the future (other requests keep stepping)      └─ cached per constraint
      ▼
engine.add_request(..., grammar=compiled)
```

One compiler serves one worker, so one tokenizer: the cache key is the
constraint, and the (constraint, tokenizer) pair is implied. The tokenizer
info is built on first use, in the pool, so a worker that never sees a
constraint never imports xgrammar (2 s) or reads its tokenizer's vocabulary.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from shared.errors import InvalidRequestError
from shared.structured_outputs import FIELD, StructuredOutputsParams
from worker.structured.schema_check import check_enforceable

MAX_CACHED_GRAMMARS = 256
NUM_COMPILE_THREADS = 2
# xgrammar's errors start with "[13:21:32] /project/cpp/regex_converter.cc:94: ".
_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


def choice_grammar(choices: tuple[str, ...]) -> str:
    """EBNF accepting exactly one of `choices` (JSON string escapes are EBNF's too)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class GrammarCompiler:
    def __init__(
        self, tokenizer_path: str | Path, vocab_size: int, eos_token_ids: tuple[int, ...]
    ) -> None:
        self._tokenizer_path = tokenizer_path
        self.vocab_size = vocab_size
        self._eos_token_ids = eos_token_ids
        self._pool = ThreadPoolExecutor(NUM_COMPILE_THREADS, thread_name_prefix="pagoda-grammar")
        self._lock = threading.Lock()
        self._xgr_compiler: Any = None
        self._cache: OrderedDict[StructuredOutputsParams, Any] = OrderedDict()
        self.num_compiled = 0  # cache misses, for tests and stats

    def submit(self, constraint: StructuredOutputsParams) -> Future:
        """Compile in the pool; the future holds the CompiledGrammar or the
        InvalidRequestError naming what does not compile."""
        with self._lock:
            cached = self._cache.get(constraint)
            if cached is not None:
                self._cache.move_to_end(constraint)
                future: Future = Future()
                future.set_result(cached)
                return future
        return self._pool.submit(self.compile, constraint)

    def compile(self, constraint: StructuredOutputsParams) -> Any:
        """The compiled grammar (from the cache when it is there); blocks."""
        with self._lock:
            if constraint in self._cache:
                self._cache.move_to_end(constraint)
                return self._cache[constraint]
        compiled = self._compile(constraint)
        with self._lock:
            self.num_compiled += 1
            self._cache[constraint] = compiled
            while len(self._cache) > MAX_CACHED_GRAMMARS:
                self._cache.popitem(last=False)
        return compiled

    def _compiler(self) -> Any:
        with self._lock:
            if self._xgr_compiler is None:
                import xgrammar as xgr

                from worker.structured.tokenizer_info import build_tokenizer_info

                info = build_tokenizer_info(
                    self._tokenizer_path, self.vocab_size, self._eos_token_ids
                )
                self._xgr_compiler = xgr.GrammarCompiler(info, max_threads=1)
            return self._xgr_compiler

    def _compile(self, constraint: StructuredOutputsParams) -> Any:
        compiler = self._compiler()
        kind = constraint.kind
        if kind == "json":
            check_enforceable(constraint.json)
        try:
            if kind == "json":
                # Compact separators (", " and ": ", as json.dumps): with any whitespace
                # allowed, a weak model can pad forever between two tokens.
                return compiler.compile_json_schema(constraint.json, any_whitespace=False)
            if kind == "json_object":
                return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if kind == "regex":
                return compiler.compile_regex(constraint.regex)
            if kind == "choice":
                return compiler.compile_grammar(choice_grammar(constraint.choice))
            return compiler.compile_grammar(constraint.grammar)
        except (RuntimeError, ValueError) as exc:
            reason = _LOG_PREFIX.sub("", str(exc).strip())
            raise InvalidRequestError(f"{FIELD}.{kind}", f"does not compile: {reason}") from None

    def clear_cache(self) -> None:
        """Forget every compiled grammar (ours and xgrammar's own)."""
        with self._lock:
            self._cache.clear()
            if self._xgr_compiler is not None:
                self._xgr_compiler.clear_cache()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
