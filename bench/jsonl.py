"""Result lines: one JSON object per line, printed and appended to a results file."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def emit(record: dict[str, Any], output: str | Path | None = None) -> None:
    """Print `record` as one JSON line, and append it to `output` when given."""
    line = json.dumps(record)
    print(line, flush=True)
    if output is not None:
        path = Path(output)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(line + "\n")


def read_records(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Every JSON object line of `paths`, in order; other lines (logs) are skipped."""
    records = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            line = line.strip()
            if line.startswith("{"):
                records.append(json.loads(line))
    return records
