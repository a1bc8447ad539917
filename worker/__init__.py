"""The worker: one model, one engine, one gRPC service.

`from worker import LLM, SamplingParams` is the offline API. Imports are lazy
so that light users of the package (the CLI, the router) do not load torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shared.sampling_params import SamplingParams
    from shared.structured_outputs import StructuredOutputsParams
    from worker.llm import LLM

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from worker.llm import LLM

        return LLM
    if name == "SamplingParams":
        from shared.sampling_params import SamplingParams

        return SamplingParams
    if name == "StructuredOutputsParams":
        from shared.structured_outputs import StructuredOutputsParams

        return StructuredOutputsParams
    raise AttributeError(name)
