"""The router keeps an idle HTTP connection open longer than clients keep theirs.

httpx (and the openai SDK over it) reuses a pooled connection idle for up to 5 s.
uvicorn's own default closes one after 5 s: a client reusing it at that moment
sends its request into a closing socket and gets a ReadError (the soak saw 36 in
76,124 requests). With --timeout-keep-alive above the clients' expiry the client
is the side that closes.
"""

from __future__ import annotations

import socket
import time

import httpx

from router.config import RouterConfig

IDLE_S = 6.0  # past the 5 s that httpx keeps a connection, and uvicorn's default


def get_health(sock: socket.socket, port: int) -> bytes:
    sock.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        answer += chunk
    return answer


def test_the_default_keep_alive_outlasts_the_clients_pools():
    client_expiry = httpx.Limits().keepalive_expiry
    assert client_expiry is not None and RouterConfig.timeout_keep_alive > 2 * client_expiry


def test_an_idle_connection_is_still_open_after_the_clients_expiry(served):
    port = int(served.base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        assert get_health(sock, port).startswith(b"HTTP/1.1 200")
        time.sleep(IDLE_S)
        # Same socket: the router did not close it while it sat idle.
        assert get_health(sock, port).startswith(b"HTTP/1.1 200")
