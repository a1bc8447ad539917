"""One host-to-device copy of a step's inputs.

Every array a step needs on the device (token ids, positions, the backend's
attention arrays, sampling parameters) is packed into one pinned host buffer
and crosses in one asynchronous copy; the tensors handed out are views into
one device buffer, each at a 64-byte aligned offset:

    host (pinned)   | input_ids | positions | slot_mapping | ... |   --one copy-->
    device          | input_ids | positions | slot_mapping | ... |   views

On CPU nothing is copied: the views are the host arrays themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

_ALIGN = 64


def layout_offsets(arrays: dict[str, np.ndarray]) -> tuple[dict[str, int], int]:
    """Byte offset of each array (64-byte aligned, in order) and the bytes spanned."""
    offsets, end = {}, 0
    for name, array in arrays.items():
        offsets[name] = end
        end += -(-array.nbytes // _ALIGN) * _ALIGN
    return offsets, end


@dataclass
class Staged:
    tensors: dict[str, torch.Tensor]  # name -> view on the device
    offsets: dict[str, int]  # name -> byte offset in `buffer`
    buffer: torch.Tensor | None  # the device buffer (None on CPU)


class StepStaging:
    def __init__(self, device: torch.device, capacity: int = 1 << 20) -> None:
        self.device = device
        self._host: torch.Tensor | None = None
        self._device_buffer: torch.Tensor | None = None
        self._copied: torch.cuda.Event | None = None  # the last copy read the host buffer
        if device.type != "cpu":
            self._reserve(capacity)

    @property
    def is_zero_copy(self) -> bool:
        """Whether upload() hands back the host arrays themselves (on CPU)."""
        return self.device.type == "cpu"

    def _reserve(self, nbytes: int) -> None:
        if self._host is not None and self._host.numel() >= nbytes:
            return
        if self._copied is not None:
            self._copied.synchronize()
        size = max(nbytes, 2 * (0 if self._host is None else self._host.numel()))
        pin = self.device.type == "cuda"
        self._host = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
        self._device_buffer = torch.empty(size, dtype=torch.uint8, device=self.device)

    def upload(self, arrays: dict[str, np.ndarray]) -> Staged:
        """Device views of `arrays` (contiguous numpy arrays), in one copy."""
        if self.device.type == "cpu":
            tensors = {name: torch.from_numpy(a) for name, a in arrays.items()}
            return Staged(tensors, {}, None)
        offsets, total = layout_offsets(arrays)
        self._reserve(total)
        if self._copied is not None:
            # The previous step's copy may still be reading the pinned buffer.
            self._copied.synchronize()
        host = self._host.numpy()
        for name, array in arrays.items():
            start = offsets[name]
            host[start : start + array.nbytes] = np.ascontiguousarray(array).view(np.uint8).ravel()
        self._device_buffer[:total].copy_(self._host[:total], non_blocking=True)
        if self.device.type == "cuda":
            self._copied = torch.cuda.Event()
            self._copied.record()
        tensors = {
            name: view_of(self._device_buffer, offsets[name], array)
            for name, array in arrays.items()
        }
        return Staged(tensors, offsets, self._device_buffer)


def view_of(buffer: torch.Tensor, offset: int, like: np.ndarray) -> torch.Tensor:
    """The bytes of `buffer` at `offset` seen as an array of like's dtype and shape."""
    dtype = torch.from_numpy(np.empty(0, dtype=like.dtype)).dtype
    return buffer[offset : offset + like.nbytes].view(dtype).view(like.shape)
