"""Stop strings, found across token boundaries and never leaked into a stream.

Text reaches a client only once no stop string can still begin in it: the
longest tail of the text that is a proper prefix of some stop string is held
back until the next text decides it.

```
emitted ........ | held (could start a stop string) | new text
```

NOTE: a stop string therefore always lies wholly in held + new text: had it
begun in emitted text, that text would have been a prefix of it and held.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopChecker:
    def __init__(self, stop: Sequence[str] = (), include_stop_str_in_output: bool = False) -> None:
        self.stop = tuple(s for s in stop if s)
        self.include_stop_str_in_output = include_stop_str_in_output
        self._held = ""

    def push(self, text: str) -> tuple[str, str | None]:
        """Add text; return (text that may be emitted, the stop string that matched or None).

        After a match the sequence is over: the text after the stop string is dropped.
        """
        if not self.stop:
            return text, None
        buffer = self._held + text
        match = self._earliest_match(buffer)
        if match is not None:
            start, stop = match
            end = start + len(stop) if self.include_stop_str_in_output else start
            self._held = ""
            return buffer[:end], stop
        hold = self._longest_prefix_tail(buffer)
        self._held = buffer[len(buffer) - hold :]
        return buffer[: len(buffer) - hold], None

    def flush(self) -> str:
        """The sequence ended without a stop string: release what was held."""
        held, self._held = self._held, ""
        return held

    def _earliest_match(self, buffer: str) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self.stop:
            start = buffer.find(stop)
            if start >= 0 and (best is None or start < best[0]):
                best = (start, stop)
        return best

    def _longest_prefix_tail(self, buffer: str) -> int:
        """Length of the longest tail of `buffer` that some stop string starts with."""
        longest = min(len(buffer), max(len(s) for s in self.stop) - 1)
        for size in range(longest, 0, -1):
            tail = buffer[-size:]
            if any(stop.startswith(tail) for stop in self.stop):
                return size
        return 0
