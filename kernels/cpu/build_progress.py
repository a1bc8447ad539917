"""What a CPU kernel build says while it runs: it takes minutes on a busy machine,
and a start that sits silent that long looks hung (and gets killed mid-build)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shared.logging import get_logger

logger = get_logger("kernels.cpu")

MODULE_NAME = "pagoda_cpu_kernels"
PROGRESS_INTERVAL_S = 30.0


def is_built(build_dir: Path, module: str = MODULE_NAME) -> bool:
    return (build_dir / f"{module}.so").exists()


@contextmanager
def build_reported(
    build_dir: Path, module: str = MODULE_NAME, interval_s: float = PROGRESS_INTERVAL_S
) -> Iterator[None]:
    """Around torch's `load` of `module`: nothing when it is built already; else a
    line when compiling starts, one every `interval_s` while it runs, one at the end."""
    if is_built(build_dir, module):
        yield
        return
    logger.info(
        "compiling CPU kernels into %s (minutes on a first start; `pagoda build-kernels` "
        "does it ahead of time)...",
        build_dir,
    )
    started = time.monotonic()
    done = threading.Event()

    def report() -> None:
        while not done.wait(interval_s):
            logger.info("still compiling CPU kernels (%.0fs so far)...", time.monotonic() - started)

    reporter = threading.Thread(target=report, name="pagoda-kernel-build", daemon=True)
    reporter.start()
    try:
        yield
    finally:
        done.set()
        reporter.join()
    logger.info("CPU kernels compiled in %.0fs", time.monotonic() - started)
