"""Loopback ports for servers another process will bind.

A port found free by binding port 0 and closing is free at that moment only.
A child that binds it a few seconds later can find it taken, since every
outgoing connection on the machine draws its source port from the same
ephemeral range (and so does any other bind to port 0).

`free_port_run()` draws from below that range instead (Linux's is 32768-60999
by default): no outgoing connection or bind(0) takes those ports, only a
process that names one, so a port drawn there stays free for a script that
starts a server on it. (It also finds runs of consecutive ports, for servers
that listen on a port derived from another.)

`PortReservation` closes the window altogether: it keeps a socket bound to the port,
not listening, with SO_REUSEADDR. On Linux the kernel then hands the port
to no bind(0) and no connect(), while a server that sets SO_REUSEADDR itself
(gRPC's and the stdlib's HTTP servers do) may still bind and listen on it —
and may again after it restarts, as long as the reservation is held.
"""

from __future__ import annotations

import contextlib
import random
import socket


def free_port_run(count: int = 1, low: int = 20000, high: int = 32000) -> int:
    """The first of `count` consecutive ports free on 127.0.0.1, drawn at random
    from [low, high), below the ephemeral range."""
    rng = random.Random()
    for _ in range(200):
        first = rng.randrange(low, high - count)
        try:
            with contextlib.ExitStack() as held:
                for port in range(first, first + count):
                    s = held.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
    raise RuntimeError(f"no {count} consecutive free ports in {low}-{high}")


class PortReservation:
    """A port held for a server in another process until close()."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._socket = socket.socket()
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, 0))
        self.port: int = self._socket.getsockname()[1]

    def close(self) -> None:
        self._socket.close()

    def __enter__(self) -> PortReservation:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
