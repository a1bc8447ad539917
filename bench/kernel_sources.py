"""Kernel source files at a git ref or in the working tree, staged for a bench's
own build of them (bench/decode_attention_ab.py, bench/gemv_ab.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def kernel_file(ref: str | None, name: str) -> bytes | None:
    """kernels/cpu/`name` at git `ref` (None: the working tree); None where the ref
    has no such file."""
    path = f"kernels/cpu/{name}"
    if ref is None:
        return (ROOT / path).read_bytes()
    shown = subprocess.run(["git", "show", f"{ref}:{path}"], cwd=ROOT, capture_output=True)
    return shown.stdout if shown.returncode == 0 else None


def write_if_changed(path: Path, data: bytes) -> None:
    """Leaves an unchanged file's mtime alone, so that ninja does not rebuild it."""
    if not path.exists() or path.read_bytes() != data:
        path.write_bytes(data)
