"""A reserved port: no other socket gets it, its own server binds it, again after a restart."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import urllib.request

import grpc
import pytest
from prometheus_client import CollectorRegistry, start_http_server

from shared.ports import PortReservation, free_port_run


def _plain_bind(port: int) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_reserved_port_refuses_other_binds_until_closed():
    reservation = PortReservation()
    with pytest.raises(OSError) as refused:
        _plain_bind(reservation.port)
    assert refused.value.errno == errno.EADDRINUSE
    reservation.close()
    _plain_bind(reservation.port)


async def _serve_grpc_once(port: int) -> None:
    server = grpc.aio.server()
    assert server.add_insecure_port(f"127.0.0.1:{port}") == port
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await asyncio.wait_for(channel.channel_ready(), 10)
    await server.stop(0)


def test_grpc_binds_a_reserved_port_and_binds_it_again_after_a_restart():
    with PortReservation() as reservation:
        asyncio.run(_serve_grpc_once(reservation.port))
        asyncio.run(_serve_grpc_once(reservation.port))  # the worker restarted


def test_the_metrics_server_binds_a_reserved_port():
    with PortReservation() as reservation:
        server, thread = start_http_server(reservation.port, "127.0.0.1", CollectorRegistry())
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{reservation.port}/metrics") as r:
                assert r.status == 200
        finally:
            server.shutdown()
            server.server_close()
            thread.join(5)


def test_a_port_run_is_free_and_below_the_ephemeral_range():
    first = free_port_run(3)
    assert first >= 20000 and first + 3 <= 32000
    with contextlib.ExitStack() as held:
        for port in range(first, first + 3):
            held.enter_context(socket.socket()).bind(("127.0.0.1", port))
