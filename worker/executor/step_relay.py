"""Steps to the other nodes of a multi-node group, over one TCP connection each.

Shared memory reaches only this machine's ranks, so node 0's engine also
sends each pickled step to every other node (length-prefixed frames); there a
headless `pagoda worker --node-rank R` writes it into its own shared-memory
ring for its ranks (remote_node.py). The connection carries nothing back: a
remote node that closes it (or dies) shows up as end-of-file.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import time

from shared.errors import ConfigError

_LENGTH = struct.Struct("!Q")


def relay_port(master_port: int) -> int:
    """The step relay listens one above the rendezvous port."""
    return master_port + 1


class StepRelayServer:
    """On node 0: accept one connection per other node, then send each step to all."""

    def __init__(self, host: str, port: int, num_nodes: int, timeout: float) -> None:
        self._listener = socket.create_server((host, port), reuse_port=False)
        self._listener.settimeout(timeout)
        self.peers: list[socket.socket] = []
        try:
            for _ in range(num_nodes - 1):
                peer, _ = self._listener.accept()
                peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.peers.append(peer)
        except TimeoutError:
            self.close()
            raise ConfigError(
                f"{len(self.peers) + 1} of {num_nodes} nodes reached {host}:{port} within "
                f"{timeout:g}s; start 'pagoda worker --node-rank R' on the others, with the same "
                "--master-addr and --master-port"
            ) from None

    def send(self, payload: bytes) -> None:
        frame = _LENGTH.pack(len(payload)) + payload
        for peer in self.peers:
            peer.sendall(frame)

    def lost_node(self) -> int | None:
        """The index (1-based node) of a peer whose connection closed, if any."""
        readable, _, _ = select.select(self.peers, [], [], 0)
        for peer in readable:
            with contextlib.suppress(OSError):
                if peer.recv(1, socket.MSG_PEEK):
                    continue
            return self.peers.index(peer) + 1
        return None

    def close(self) -> None:
        for peer in self.peers:
            with contextlib.suppress(OSError):
                peer.close()
        self._listener.close()


def connect_to_relay(host: str, port: int, timeout: float) -> socket.socket:
    """On node R > 0: dial node 0's relay, retrying until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=5)
            if sock.getsockname() == sock.getpeername():
                # NOTE: dialling a loopback port in the ephemeral range before anyone
                # listens can pick that very port as our own end (TCP simultaneous
                # open): connected to ourselves, we would hold the port node 0 is
                # about to bind ("Address already in use" there, a hang here).
                sock.close()
                raise ConnectionRefusedError("connected to itself")
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as exc:
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"could not reach node 0's step relay at {host}:{port} within {timeout:g}s "
                    f"({exc}); is 'pagoda worker --node-rank 0' running with this --master-addr "
                    "and --master-port?"
                ) from None
            time.sleep(0.2)


def receive_frame(sock: socket.socket) -> bytes | None:
    """The next step, or None when node 0 closed the connection."""
    header = _recv_exactly(sock, _LENGTH.size)
    if header is None:
        return None
    return _recv_exactly(sock, _LENGTH.unpack(header)[0])


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)
