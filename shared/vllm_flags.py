"""Flags vLLM users pass by habit that Pagoda has no flag of the same name for.

Each is accepted with vLLM's meaning where Pagoda already behaves so (a note
in the log says how), or refused with a message naming what to use instead;
never "unrecognized arguments". Flags Pagoda has under vLLM's own name
(`--gpu-memory-utilization`, `--max-model-len`, `--enforce-eager`, ...)
are real flags of their config groups, not listed here.
"""

from __future__ import annotations

import argparse
from typing import Any

NOTES = "vllm_notes"  # where the accepted flags' notes wait until logging is set up

# flag -> the note logged when it is given
_ACCEPTED = {
    "--trust-remote-code": "not needed: Pagoda runs its own implementation of each "
    "architecture and never executes a checkpoint's code",
    "--disable-log-stats": "Pagoda logs no periodic stats; the workers' /metrics has them",
    "--swap-space": "Pagoda recomputes preempted requests and swaps nothing to CPU memory, "
    "as vLLM's v1 engine",
    "--disable-uvicorn-access-log": "the router logs no access line per request (as "
    "--disable-log-requests)",
    "--enable-log-requests": "the router logs one access line per request by default",
    "--uvicorn-log-level": "Pagoda's log level is --log-level (before the subcommand)",
}
# flag -> why it is refused, and what to use instead
_REFUSED = {
    "--download-dir": "Pagoda downloads into the Hugging Face cache: set HF_HOME or "
    "HF_HUB_CACHE instead",
    "--tokenizer-mode": "Pagoda reads tokenizer.json with the tokenizers library (vLLM's "
    "'auto' on a fast tokenizer); remove the flag",
}
_TAKES_VALUE = {"--swap-space", "--uvicorn-log-level", "--download-dir",
                "--pipeline-parallel-size", "--tokenizer-mode"}  # fmt: skip


class _Note(argparse.Action):
    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option=None):
        notes = list(getattr(namespace, NOTES, None) or [])
        notes.append(f"{option}: {_ACCEPTED[option]}")
        setattr(namespace, NOTES, notes)
        if option == "--disable-uvicorn-access-log":  # vLLM's meaning, on Pagoda's flag
            namespace.disable_log_requests = True


class _Refuse(argparse.Action):
    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option=None):
        parser.error(f"{option}: {_REFUSED[option]}")


def add_vllm_habit_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("vLLM flags with no Pagoda flag of the same name")
    for flag, note in _ACCEPTED.items():
        nargs = None if flag in _TAKES_VALUE else 0
        group.add_argument(
            flag, action=_Note, nargs=nargs, dest=f"_{flag}", help=f"Accepted: {note}."
        )
    for flag, message in _REFUSED.items():
        group.add_argument(
            flag, action=_Refuse, dest=f"_{flag}", metavar="VALUE", help=f"Refused: {message}."
        )
    parser.set_defaults(**{NOTES: []})
