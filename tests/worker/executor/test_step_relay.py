"""The step relay's dialer (worker/executor/step_relay.py) over real loopback sockets."""

from __future__ import annotations

import socket

from worker.executor import step_relay


def _self_connected() -> socket.socket:
    """A socket connected to itself, as a retrying dial to a loopback port in the
    ephemeral range can end up before anyone listens there."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.connect(sock.getsockname())  # TCP simultaneous open with itself
    assert sock.getsockname() == sock.getpeername()
    return sock


def test_a_connection_to_itself_is_dropped_and_the_dial_retried(monkeypatch):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    dials: list[socket.socket] = []
    create_connection = socket.create_connection

    def dial(address, timeout=None):
        sock = _self_connected() if not dials else create_connection(address, timeout)
        dials.append(sock)
        return sock

    monkeypatch.setattr(step_relay.socket, "create_connection", dial)
    monkeypatch.setattr(step_relay.time, "sleep", lambda seconds: None)
    with server:
        sock = step_relay.connect_to_relay("127.0.0.1", port, timeout=5)
        peer, _ = server.accept()
        with sock, peer:
            assert len(dials) == 2 and dials[0].fileno() == -1  # the first, closed
            assert sock is dials[1] and sock.getpeername() == ("127.0.0.1", port)
            sock.sendall(b"x")
            assert peer.recv(1) == b"x"
