"""Triton kernels for GPUs, each beside its plain-PyTorch twin in `kernels/`.

Triton fixes at import whether kernels compile for the GPU or run in its
interpreter (`TRITON_INTERPRET=1`), which executes them on CPU tensors with
numpy: every `@triton.jit` function, its own standard library included, is
decorated for one mode. So the mode is per process: importing this package on
a machine without CUDA, before triton itself is imported, turns the
interpreter on (unless TRITON_INTERPRET says otherwise), which is how the
tests and a CPU worker with `--attention-backend triton` run these kernels.

Conventions for the kernel modules here:
* every load and store is masked: the interpreter does not catch out-of-bounds
  accesses (it reads garbage or crashes) and `tl.device_assert` never fires in it;
* no `@triton.autotune` (it needs a driver): launch configurations are plain
  arguments with a default chooser, so tests pick tiny ones;
* `tl.dot` on bf16 inputs is wrong in the interpreter (it multiplies the raw
  bits), so kernels take a DOT_F32 constexpr, set when interpreted, that
  upcasts both tiles to float32 first; float32 dots ask for IEEE precision (not
  TF32) so float32 results match the reference on a GPU too;
* the interpreter truncates float32 -> bf16 casts where a GPU rounds to nearest
  even (Triton 3.9's interpreted fp_trunc ignores the rounding mode), so bf16
  results are bit-exact with the twins on a GPU only;
* only APIs that Triton 3.6 has (the oldest release the GPU check targets).
"""

from __future__ import annotations

import os
import sys
from functools import cache

import torch

_UNDECIDED = "triton" not in sys.modules and "TRITON_INTERPRET" not in os.environ
if _UNDECIDED and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@cache
def triton_available() -> bool:
    """Whether `import triton` works here (a CPU-only install may lack it)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@cache
def interpreted() -> bool:
    """Whether this process runs Triton kernels in the interpreter (on CPU tensors)."""
    import triton  # noqa: F401  (the mode is the one triton was imported in)

    try:
        from triton import knobs

        return bool(knobs.runtime.interpret)
    except (ImportError, AttributeError):
        return os.environ.get("TRITON_INTERPRET", "0") in ("1", "true", "True", "on")


def check_device(device: torch.device) -> None:
    """Raise a clear error where this process's Triton mode cannot serve `device`."""
    if not triton_available():
        raise RuntimeError(
            "the triton attention backend needs the triton package: pip install triton "
            "(CUDA builds of torch bring it; on CPU it runs in Triton's interpreter)"
        )
    if device.type == "cuda" and interpreted():
        raise RuntimeError(
            "TRITON_INTERPRET=1 is set, so Triton kernels would run in the interpreter, not on "
            f"{device}; unset it to compile them for the GPU"
        )
    if device.type != "cuda" and not interpreted():
        raise RuntimeError(
            f"Triton kernels in this process are compiled for the GPU and cannot run on {device}: "
            "set TRITON_INTERPRET=1 before starting to run them in Triton's interpreter"
        )
