"""Kernel source files at a git ref or in the working tree, staged for a bench's
own build of them (bench/avx2_small_m_ab.py, bench/decode_attention_ab.py,
bench/gemm_bf16_ab.py, bench/gemv_ab.py, bench/kernel_ab.py)."""

from __future__ import annotations

import hashlib
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


def load_staged(prefix: str, files: dict[str, bytes], sources: list[str], flags: list[str]):
    """`files` (name -> contents) staged in a /tmp folder named by `prefix` and a
    digest of their contents and `flags`, and `sources` (names among them) built
    there as one module of that name. Keyed by content, not by ninja's mtimes: an
    older ref's files, written later, are older than the objects of a newer
    build in a shared folder, which then silently kept the newer version."""
    from torch.utils.cpp_extension import load

    digest = hashlib.sha256(" ".join(flags).encode())
    for name, data in sorted(files.items()):
        digest.update(name.encode() + data)
    tag = f"{prefix}_{digest.hexdigest()[:12]}"
    folder = Path("/tmp") / tag
    folder.mkdir(exist_ok=True)
    for name, data in files.items():
        write_if_changed(folder / name, data)
    return load(
        name=tag,
        sources=[str(folder / name) for name in sources],
        extra_cflags=flags,
        extra_ldflags=["-fopenmp"],
        build_directory=str(folder),
        verbose=False,
    )
