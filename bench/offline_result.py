"""One offline run's result: the JSON line every offline runner prints.

Our engine (bench/offline.py), the `transformers` baseline (bench/hf_baseline.py)
and the vLLM reference print the same shape, so bench/report.py compares them
field by field. Figures an engine cannot report are null.

    prompt_tokens, output_tokens   useful work only: each request's prompt and
                                   its own max_tokens (EOS is ignored)
    elapsed_s                      generation only: no model load, no warm-up
    output_tokens_per_s            output_tokens / elapsed_s
    total_tokens_per_s             (prompt_tokens + output_tokens) / elapsed_s
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class OfflineResult:
    engine: str  # "pagoda", "hf-static-B16", "vllm"
    model: str
    workload: str
    seed: int
    requests: int
    prompt_tokens: int
    output_tokens: int
    elapsed_s: float
    dtype: str
    prefix_caching: bool | None = None
    prefix_cache_hit_rate: float | None = None  # hits / queries, in prompt tokens
    cached_prompt_tokens: int | None = None
    preemptions: int | None = None
    peak_kv_blocks: int | None = None
    peak_kv_use: float | None = None  # of all KV blocks
    kv_waste: float | None = None  # see bench/step_stats.py
    padding_waste: float | None = None  # static batching: see bench/hf_baseline.py
    weight_bytes: int | None = None  # read per decoded token, as stored: bench/weight_bytes.py
    flags: list[str] = field(default_factory=list)  # engine flags that differ from default
    machine: dict[str, Any] = field(default_factory=dict)

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s

    @property
    def total_tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.elapsed_s

    def to_json(self) -> dict[str, Any]:
        data = {"kind": "offline", **asdict(self)}
        machine = data.pop("machine")  # last, the line reads left to right
        data["output_tokens_per_s"] = round(self.output_tokens_per_s, 2)
        data["total_tokens_per_s"] = round(self.total_tokens_per_s, 2)
        data["elapsed_s"] = round(self.elapsed_s, 4)
        data["machine"] = machine
        return data
