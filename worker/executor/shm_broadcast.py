"""One writer, N readers: a ring of message slots in shared memory.

Each engine step is pickled once and written once; every rank reads the same
bytes (vLLM's MessageQueue has this shape). Per slot:

```
header (int64): [seq | nbytes | more | ack_0 ... ack_{N-1}]    data: [slot_bytes]
```

The writer fills a slot only once every reader has acked its previous
message, writes the data, then publishes `seq`; a reader waits for its next
`seq`, copies the data out and acks. A message larger than a slot spans
consecutive slots (`more` = 1 on all but the last).

Readers spin for a short while (a step usually follows the last one within
microseconds of the scheduler's work), then sleep on a per-reader eventfd
the writer rings after each message, so idle ranks cost no CPU.

NOTE: x86 keeps stores in order, so a reader that sees `seq` also sees the
data written before it; the eventfd syscalls are full barriers on any CPU.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory

import numpy as np

_SEQ, _NBYTES, _MORE, _ACKS = 0, 1, 2, 3
# Spinning longer than this between two steps means the engine is idle or busy
# elsewhere: sleep on the doorbell instead of burning a core.
SPIN_SECONDS = 200e-6
# How often a sleeping reader or a waiting writer checks its peers are alive.
POLL_SECONDS = 0.2


@dataclass(frozen=True)
class RingSpec:
    """What a process needs to attach: the segment's name and its geometry."""

    name: str
    num_readers: int
    num_slots: int
    slot_bytes: int

    @property
    def header_words(self) -> int:
        return _ACKS + self.num_readers

    @property
    def total_bytes(self) -> int:
        return self.num_slots * (self.header_words * 8 + self.slot_bytes)


class _Ring:
    def __init__(self, spec: RingSpec, create: bool) -> None:
        self.spec = spec
        self.create = create
        self.shm = shared_memory.SharedMemory(spec.name, create=create, size=spec.total_bytes)
        if not create:
            # NOTE: Python < 3.13 registers an attached segment with this process's
            # resource tracker, which would unlink it when a rank exits: the
            # creator alone owns it.
            with contextlib.suppress(Exception):
                resource_tracker.unregister(self.shm._name, "shared_memory")
        header_bytes = spec.num_slots * spec.header_words * 8
        # [num_slots, header_words]
        self.header = np.ndarray(
            (spec.num_slots, spec.header_words), dtype=np.int64, buffer=self.shm.buf
        )
        # [num_slots, slot_bytes]
        self.data = np.ndarray(
            (spec.num_slots, spec.slot_bytes), dtype=np.uint8, buffer=self.shm.buf,
            offset=header_bytes,
        )  # fmt: skip
        if create:
            self.header[:] = 0

    def close(self) -> None:
        if self.header is None:
            return
        # The numpy views must go before the mapping can close.
        self.header = self.data = None
        with contextlib.suppress(BufferError):
            self.shm.close()
        if self.create:
            with contextlib.suppress(FileNotFoundError):
                self.shm.unlink()


def _wait(ready: Callable[[], bool], doorbell: int | None, check: Callable[[], None]) -> None:
    """Until ready(): spin, then sleep on `doorbell`, calling check() every
    POLL_SECONDS (it raises when the peer we wait for is gone)."""
    deadline = time.perf_counter() + SPIN_SECONDS
    while time.perf_counter() < deadline:
        if ready():
            return
    while True:
        if doorbell is not None:
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(doorbell)  # drain before the last look: no lost rings
        if ready():
            return
        if doorbell is None:
            time.sleep(min(POLL_SECONDS, 1e-3))
        else:
            select.select([doorbell], [], [], POLL_SECONDS)
        check()


class ShmBroadcastWriter:
    def __init__(self, spec: RingSpec, doorbells: list[int], create: bool = True) -> None:
        """doorbells: each reader's eventfd (non-blocking), rung after each message.
        create: this side makes (and at close unlinks) the segment."""
        self.spec = spec
        self._ring = _Ring(spec, create)
        self._doorbells = doorbells
        self._next_seq = 1

    def put(self, payload: bytes | memoryview, check: Callable[[], None] = lambda: None) -> None:
        spec, ring = self.spec, self._ring
        view = memoryview(payload)
        offset = 0
        while True:
            seq, slot = self._next_seq, self._next_seq % spec.num_slots
            previous = seq - spec.num_slots
            acks = ring.header[slot, _ACKS:]
            _wait(lambda acks=acks, previous=previous: bool((acks >= previous).all()), None, check)
            piece = view[offset : offset + spec.slot_bytes]
            ring.data[slot, : len(piece)] = np.frombuffer(piece, dtype=np.uint8)
            offset += len(piece)
            more = offset < len(view)
            ring.header[slot, _NBYTES] = len(piece)
            ring.header[slot, _MORE] = int(more)
            ring.header[slot, _SEQ] = seq  # publish: readers look at this last
            self._next_seq += 1
            if not more:
                break
        for fd in self._doorbells:
            with contextlib.suppress(BlockingIOError):
                os.eventfd_write(fd, 1)

    def close(self) -> None:
        self._ring.close()


class ShmBroadcastReader:
    def __init__(self, spec: RingSpec, reader: int, doorbell: int, create: bool = False) -> None:
        self.spec = spec
        self._ring = _Ring(spec, create)
        self._reader = reader
        self._doorbell = doorbell
        self._next_seq = 1
        # Time spent copying messages out once they were there (not waiting).
        self.read_seconds = 0.0

    def get(self, check: Callable[[], None] = lambda: None) -> bytes:
        spec, ring = self.spec, self._ring
        pieces: list[bytes] = []
        while True:
            seq, slot = self._next_seq, self._next_seq % spec.num_slots
            header = ring.header[slot]
            _wait(lambda header=header, seq=seq: header[_SEQ] == seq, self._doorbell, check)
            start = time.perf_counter()
            pieces.append(ring.data[slot, : header[_NBYTES]].tobytes())
            more = bool(header[_MORE])
            header[_ACKS + self._reader] = seq
            self._next_seq += 1
            self.read_seconds += time.perf_counter() - start
            if not more:
                return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def close(self) -> None:
        self._ring.close()


def make_doorbell() -> int:
    """An eventfd a writer rings and a reader sleeps on (inheritable by children)."""
    fd = os.eventfd(0, os.EFD_NONBLOCK)
    os.set_inheritable(fd, True)
    return fd
