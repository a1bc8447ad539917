"""Host/device mix-ups caught without a GPU: the step's inputs, each backend's
metadata and the sampling parameters are built for the `meta` device (a
non-CPU target), and every tensor they hand out must be on it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from shared.sampling_params import SamplingParams
from worker.attention.backends import get_attention_backend
from worker.runner.cuda_graphs import capture_sizes
from worker.runner.model_runner import _on_device
from worker.runner.request_state import RequestState
from worker.runner.sampling_inputs import build_sampling_metadata
from worker.runner.staging import StepStaging
from worker.runner.step_inputs import build_step_inputs

META = torch.device("meta")


def _states():
    params = [
        SamplingParams(temperature=0, max_tokens=4),
        SamplingParams(temperature=0.8, top_k=5, top_p=0.9, presence_penalty=0.5, seed=3),
        SamplingParams(temperature=0.5, logit_bias={7: 2.0}, min_tokens=2),
    ]
    states = []
    for i, (p, n) in enumerate(zip(params, [9, 1, 5])):
        states.append(
            RequestState(
                f"r{i}", list(range(3, 3 + n)), n, p, [4 * i, 4 * i + 1, 4 * i + 2], n - 1, None
            )
        )
    return states


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif dataclasses.is_dataclass(obj):
        for field in dataclasses.fields(obj):
            yield from _tensors(getattr(obj, field.name))


@pytest.mark.parametrize("backend_name", ["triton", "torch"])
def test_step_inputs_and_metadata_land_on_the_target_device(backend_name):
    states = _states()
    inputs = build_step_inputs(states, [1, 1, 1], block_size=4)
    backend = get_attention_backend(backend_name, META)
    sampling = build_sampling_metadata(states, 64, (2,), torch.device("cpu"))
    arrays = {
        "input_ids": inputs.input_ids,
        "positions": inputs.positions,
        **backend.device_arrays(inputs.layout),
        "logits_indices": inputs.logits_indices,
    }
    for field in dataclasses.fields(sampling):
        value = getattr(sampling, field.name)
        if isinstance(value, torch.Tensor):
            arrays[f"sampling.{field.name}"] = value.numpy()
    staged = StepStaging(META).upload(arrays)
    assert staged.buffer.device == META
    metadata = backend.build_metadata(inputs.layout, staged.tensors)
    on_device = _on_device(sampling, staged.tensors)
    found = list(staged.tensors.values()) + list(_tensors(metadata)) + list(_tensors(on_device))
    assert len(found) > 10
    assert all(t.device == META for t in found), [t.device for t in found]
    # Staged views keep dtype and shape, at 64-byte aligned offsets of one buffer.
    assert staged.tensors["block_tables"].shape == (3, 3)
    assert staged.tensors["slot_mapping"].dtype == torch.int64
    assert all(offset % 64 == 0 for offset in staged.offsets.values())


def test_padded_decode_step_for_a_graph():
    """Three decode rows padded to 4 sequences and 8 block-table columns."""
    inputs = build_step_inputs(_states(), [1, 1, 1], block_size=4).padded(4, 8)
    layout = inputs.layout
    assert layout.query_start_loc.tolist() == [0, 1, 2, 3, 4]
    assert layout.seq_lens.tolist() == [9, 1, 5, 0]  # the padding row sees no key
    assert layout.slot_mapping.tolist()[-1] == -1  # and writes nothing
    assert layout.block_tables.shape == (4, 8)
    assert inputs.input_ids.tolist()[-1] == 0 and inputs.positions.tolist()[-1] == 0
    assert inputs.logits_indices.tolist() == [0, 1, 2]


def test_capture_sizes_follow_vllms_ladder():
    assert capture_sizes(256)[:6] == [1, 2, 4, 8, 16, 24]
    assert capture_sizes(256)[-1] == 256
    assert capture_sizes(512)[-3:] == [480, 496, 512]
    assert capture_sizes(5) == [1, 2, 4, 8]  # the rung covering 5 sequences
    assert capture_sizes(100)[-2:] == [96, 104]
    assert capture_sizes(4096)[-1] == 512


def test_empty_arrays_stage():
    staged = StepStaging(META).upload({"a": np.zeros(0, dtype=np.int64), "b": np.ones(3, np.int32)})
    assert staged.tensors["a"].shape == (0,) and staged.tensors["b"].shape == (3,)
