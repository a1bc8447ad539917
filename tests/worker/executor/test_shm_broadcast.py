"""The step broadcast ring: every reader gets every message, whole and in order."""

from __future__ import annotations

import os
import threading
import uuid

import pytest

from worker.executor.shm_broadcast import (
    RingSpec,
    ShmBroadcastReader,
    ShmBroadcastWriter,
    make_doorbell,
)


@pytest.fixture
def ring():
    """ring(num_readers, num_slots, slot_bytes) -> (writer, readers)."""
    made = []

    def make(num_readers=2, num_slots=4, slot_bytes=64):
        spec = RingSpec(f"pagoda-test-{uuid.uuid4().hex[:8]}", num_readers, num_slots, slot_bytes)
        doorbells = [make_doorbell() for _ in range(num_readers)]
        writer = ShmBroadcastWriter(spec, doorbells)
        readers = [ShmBroadcastReader(spec, i, fd) for i, fd in enumerate(doorbells)]
        made.append((writer, readers, doorbells))
        return writer, readers

    yield make
    for writer, readers, doorbells in made:
        for reader in readers:
            reader.close()
        writer.close()
        for fd in doorbells:
            os.close(fd)


def test_each_reader_gets_each_message_in_order(ring):
    writer, readers = ring(num_readers=2, num_slots=4, slot_bytes=64)
    messages = [bytes([i]) * (i * 7) for i in range(3)]  # 0, 7 and 14 bytes
    for m in messages:
        writer.put(m)
    for reader in readers:
        assert [reader.get() for _ in messages] == messages


def test_a_message_bigger_than_a_slot_spans_slots(ring):
    writer, readers = ring(num_readers=1, num_slots=4, slot_bytes=16)
    big = bytes(range(200)) * 1  # 200 bytes = 13 slots, more than the ring holds
    done = threading.Thread(target=writer.put, args=(big,))
    done.start()  # the writer waits for the reader to free slots as it goes
    assert readers[0].get() == big
    done.join(5)
    assert not done.is_alive()


def test_the_writer_waits_for_the_slowest_reader(ring):
    writer, (fast, slow) = ring(num_readers=2, num_slots=2, slot_bytes=8)
    writer.put(b"a")
    writer.put(b"b")
    assert fast.get() == b"a" and fast.get() == b"b"
    third = threading.Thread(target=writer.put, args=(b"c",))
    third.start()
    third.join(0.3)
    assert third.is_alive()  # slot 1 still holds "a" for the slow reader
    assert slow.get() == b"a"
    third.join(5)
    assert not third.is_alive()
    assert slow.get() == b"b" and slow.get() == b"c" and fast.get() == b"c"


def test_a_sleeping_reader_wakes_on_the_doorbell_and_checks_its_peer(ring):
    writer, (reader,) = ring(num_readers=1)
    got = []
    waiting = threading.Thread(target=lambda: got.append(reader.get()))
    waiting.start()
    waiting.join(0.3)  # past the spin: asleep on the eventfd
    writer.put(b"step")
    waiting.join(5)
    assert got == [b"step"]

    class PeerGone(Exception):
        pass

    def check():
        raise PeerGone

    with pytest.raises(PeerGone):
        reader.get(check)  # nothing comes: the check runs while it sleeps
