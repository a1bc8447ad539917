"""Which gRPC core transport the router and the workers run on (set before grpc loads).

grpcio's default TCP transport (the EventEngine) hands every message through its
own pool of four `event_engine` threads: reading a worker's stream, a router woke
~7 of them per token, a worker ~2.5. On a 2-core machine at one stream each
wake-up preempts one of the engine's two OpenMP threads, and the other spins at
its next barrier meanwhile. The legacy transport (iomgr, polled by grpcio's own
aio poller thread) moves the same bytes with ~0.7 wake-ups per token in each
process: bench/serve_threads.py measured the gRPC threads' CPU per token at one
stream going from 273 + 95 us (router + worker) to 28 + 28 us.

grpc reads GRPC_EXPERIMENTS once, when the module loads, so this runs at the top
of the router's and the worker's packages; a value the user set is kept.
"""

from __future__ import annotations

import os
import sys

# The EventEngine's client and listener sides, turned off.
LEGACY_TCP = "-event_engine_client,-event_engine_listener"


def prefer_legacy_tcp() -> None:
    """Pick the legacy TCP transport, unless GRPC_EXPERIMENTS is set or grpc loaded already."""
    if "grpc" in sys.modules:  # too late: the transport is chosen (tests import grpc first)
        return
    os.environ.setdefault("GRPC_EXPERIMENTS", LEGACY_TCP)
