"""The machine's memory as the kernel reports it (/proc/meminfo): what the KV
budget (worker/runner/kv_budget.py) and the half-stored weights' float32 copies
(worker/layers/cpu_half_f32.py) size themselves against."""

from __future__ import annotations


def meminfo() -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes."""
    fields = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, value = line.split(":", 1)
            if name in ("MemTotal", "MemAvailable"):
                fields[name] = int(value.split()[0]) * 1024
    if len(fields) != 2:
        raise RuntimeError("cannot read MemTotal and MemAvailable from /proc/meminfo")
    return fields["MemTotal"], fields["MemAvailable"]
