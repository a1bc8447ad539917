"""User + system CPU seconds of a server process tree (bench/serve_omp_ab.sh).

python -m bench.serve_omp_cpu PID [SINCE]   -> seconds now, or seconds since SINCE
"""

from __future__ import annotations

import sys

from bench.serve_cpu import cpu_seconds


def main() -> int:
    total = sum(s for _, s in cpu_seconds(int(sys.argv[1])).values())
    since = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    print(f"{total - since:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
