"""The probe behind these figures: in the `pagoda serve` process only (a soak passes
PYTHONPATH on), a thread appends RSS and glibc's mallinfo2() every PROBE_EVERY
seconds to PROBE_OUT, and with PROBE_TYPES=1 the count of gc-tracked objects.

    PYTHONPATH=bench/results/soak-rss-ab/probe PROBE_OUT=/tmp/probe.jsonl \\
        PROBE_TYPES=1 python -m bench.soak --duration 360 --sample-every 30
"""

import ctypes
import gc
import json
import os
import threading
import time

_FIELDS = (
    "arena", "ordblks", "smblks", "hblks", "hblkhd",
    "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
)  # fmt: skip
_MB_FIELDS = ("arena", "hblkhd", "uordblks", "fordblks", "keepcost")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _FIELDS]


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


def _sample_forever(out: str, every: float, count_objects: bool) -> None:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    started = time.monotonic()
    while True:
        time.sleep(every)
        info = libc.mallinfo2()
        record = {"t": round(time.monotonic() - started, 1), "rss_mb": round(_rss_mb(), 1)}
        for name in _FIELDS:
            value = getattr(info, name)
            record[name] = round(value / 2**20, 2) if name in _MB_FIELDS else value
        if count_objects:
            record["gc_objects"] = len(gc.get_objects())
        with open(out, "a") as f:
            f.write(json.dumps(record) + "\n")


def _is_serve() -> bool:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return b"shared.cli" in argv and b"serve" in argv


if _is_serve():
    threading.Thread(
        target=_sample_forever,
        args=(
            os.environ.get("PROBE_OUT", "/tmp/probe.jsonl"),
            float(os.environ.get("PROBE_EVERY", "30")),
            os.environ.get("PROBE_TYPES") == "1",
        ),
        daemon=True,
        name="rss-probe",
    ).start()
