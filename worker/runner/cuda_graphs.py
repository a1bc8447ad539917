"""CUDA graphs for pure-decode steps.

At start-up the runner captures one graph of the model's forward per batch
size of vLLM's ladder (1, 2, 4, 8, then every 8 up to 256 and every 16 beyond,
capped by --max-num-seqs and 512), largest first, sharing one memory pool. A
decode step of n sequences is padded to the smallest captured size >= n
(padding rows: token 0 at position 0, an empty context, KV slot -1) and
replayed; larger and mixed steps run eagerly.

Each graph reads its inputs from static device buffers. The step's inputs have
already crossed in the step's one host-to-device copy (staging.py), laid out as
the capture laid them out (same arrays, order and shapes for the padded size),
so one device-to-device copy of that leading byte range fills the static
buffer:

    staged  | input_ids | positions | attention arrays | sampling ... |
    static  | input_ids | positions | attention arrays |                 (size B's layout)

`capture` is pluggable: `TorchCUDAGraphCapture` on a GPU; tests pass one that
replays by calling the function again, which exercises the padding and buffer
logic on CPU (a replay sees the capture-time tensors, as a real graph does).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch

from shared.logging import get_logger
from worker.attention.backends.base import AttentionBackend
from worker.attention.forward_context import forward_context
from worker.attention.metadata import BatchLayout
from worker.runner.staging import Staged, layout_offsets, view_of
from worker.runner.step_inputs import StepInputs

logger = get_logger(__name__)

MAX_CAPTURE_SIZE = 512


def capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's ladder, up to the smallest rung that covers max_num_seqs (512 at most)."""
    ladder = [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, MAX_CAPTURE_SIZE + 1, 16))
    limit = min(max_num_seqs, MAX_CAPTURE_SIZE)
    sizes = [s for s in ladder if s < limit]
    return sizes + [next(s for s in ladder if s >= limit)]


class GraphCapture(Protocol):
    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, Callable[[], None]]:
        """Record fn (already warmed up); return its output tensor and a replay
        that recomputes that output in place."""


class TorchCUDAGraphCapture:
    def __init__(self) -> None:
        self.pool = None

    def capture(self, fn):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        if self.pool is None:
            self.pool = graph.pool()
        return out, graph.replay


def dummy_decode_inputs(num_seqs: int, max_num_blocks: int) -> StepInputs:
    """A decode batch of `num_seqs` padding rows (empty contexts, slot -1): what a
    capture records. Replays overwrite every one of its arrays."""
    return StepInputs(
        input_ids=np.zeros(num_seqs, dtype=np.int64),
        positions=np.zeros(num_seqs, dtype=np.int64),
        layout=BatchLayout(
            query_start_loc=np.arange(num_seqs + 1, dtype=np.int32),
            seq_lens=np.zeros(num_seqs, dtype=np.int32),
            block_tables=np.zeros((num_seqs, max_num_blocks), dtype=np.int32),
            slot_mapping=np.full(num_seqs, -1, dtype=np.int64),
        ),
        logits_indices=np.zeros(0, dtype=np.int64),
        sample_req_ids=[],
        prompt_logprob_spans={},
    )


def graph_arrays(inputs: StepInputs, backend: AttentionBackend) -> dict[str, np.ndarray]:
    """The arrays a graph reads, in the order a step stages them first."""
    return {
        "input_ids": inputs.input_ids,
        "positions": inputs.positions,
        **backend.device_arrays(inputs.layout),
    }


class _Graph:
    def __init__(self, out, replay, views, offsets, end) -> None:
        self.out = out  # [size, hidden_size], rewritten by each replay
        self.replay = replay
        self.views = views  # name -> static input view
        self.offsets = offsets  # name -> byte offset in the static buffer
        self.end = end  # bytes of the static buffer this size's layout spans


class CUDAGraphRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        backend: AttentionBackend,
        device: torch.device,
        sizes: list[int],
        max_num_blocks: int,
        capture: GraphCapture | None = None,
    ) -> None:
        self.model, self.backend, self.device = model, backend, device
        self.sizes = sorted(sizes)
        self.max_num_blocks = max_num_blocks
        self.capture_impl = capture or TorchCUDAGraphCapture()
        largest = graph_arrays(dummy_decode_inputs(self.sizes[-1], max_num_blocks), backend)
        # Static inputs of every size, never reallocated (graphs hold their addresses).
        self.buffer = torch.zeros(layout_offsets(largest)[1], dtype=torch.uint8, device=device)
        self.graphs: dict[int, _Graph] = {}

    def size_for(self, inputs: StepInputs) -> int | None:
        """The captured size this step replays at, or None (run it eagerly)."""
        layout = inputs.layout
        if not self.graphs or not layout.is_decode_only or layout.num_seqs > self.sizes[-1]:
            return None
        if layout.block_tables.shape[1] > self.max_num_blocks:
            return None
        return next(s for s in self.sizes if s >= layout.num_seqs)

    @torch.inference_mode()
    def capture_all(self) -> None:
        start = time.perf_counter()
        is_cuda = self.device.type == "cuda"
        free_before = torch.cuda.mem_get_info(self.device)[0] if is_cuda else 0
        for size in reversed(self.sizes):  # largest first: smaller ones reuse its pool
            inputs = dummy_decode_inputs(size, self.max_num_blocks)
            arrays = graph_arrays(inputs, self.backend)
            offsets, end = layout_offsets(arrays)
            views = {n: view_of(self.buffer, offsets[n], a) for n, a in arrays.items()}
            for name, array in arrays.items():
                views[name].copy_(torch.from_numpy(array))
            metadata = self.backend.build_metadata(inputs.layout, views)

            def forward(views=views, metadata=metadata) -> torch.Tensor:
                with forward_context(metadata):
                    return self.model(views["input_ids"], views["positions"])

            forward()  # warm-up: compiles the kernels, sizes the allocator's blocks
            out, replay = self.capture_impl.capture(forward)
            self.graphs[size] = _Graph(out, replay, views, offsets, end)
        used = 0
        if is_cuda:
            torch.cuda.synchronize(self.device)
            used = free_before - torch.cuda.mem_get_info(self.device)[0]
        logger.info(
            "captured CUDA graphs for %d decode batch sizes (%d..%d) in %.1f s, using %.2f GiB",
            len(self.sizes),
            self.sizes[0],
            self.sizes[-1],
            time.perf_counter() - start,
            used / 2**30,
        )

    def replay(self, size: int, staged: Staged) -> torch.Tensor:
        """Run graph `size` on a step staged with that size's layout first; return
        its hidden states [size, hidden_size] (rows past the step's are padding)."""
        graph = self.graphs[size]
        if staged.buffer is not None:
            for name, offset in graph.offsets.items():
                assert staged.offsets[name] == offset, f"{name} staged off the graph's layout"
            self.buffer[: graph.end].copy_(staged.buffer[: graph.end], non_blocking=True)
        else:  # on CPU the staged arrays are separate host tensors
            for name, view in graph.views.items():
                view.copy_(staged.tensors[name])
        graph.replay()
        return graph.out
