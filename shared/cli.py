"""The `pagoda` command: one entry point, one subcommand per service or tool.

Each subcommand lives in the package that owns it and is imported only when
chosen, so `pagoda router` never loads torch. A subcommand module provides
`add_arguments(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from shared.logging import configure_logging, get_logger
from shared.vllm_flags import NOTES

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("worker.generate_cli", "Generate offline from prompts with the engine."),
    "worker": ("worker.service.cli", "Serve one model over gRPC (token ids in, token ids out)."),
    "router": ("router.cli", "Serve the OpenAI HTTP and gRPC text APIs in front of workers."),
    "serve": ("router.serve", "Serve a model on this machine: a router and N workers."),
    "bench": ("bench.cli", "Benchmarks: workloads, offline and online runs, roofline, summary."),
    "build-kernels": (
        "kernels.build_cli",
        "Compile the CPU kernels for this machine now (else the first worker start does).",
    ),
}


def register_subcommand(name: str, module: str, help_text: str) -> None:
    SUBCOMMANDS[name] = (module, help_text)


class _DefaultsFormatter(argparse.HelpFormatter):
    """--help shows each flag's default, unless its help already says it (or there is
    none to show)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or not action.option_strings
            or default in (None, False, argparse.SUPPRESS, [], ())
            or isinstance(action, argparse._HelpAction)
        ):
            return text
        return f"{text} (default: %(default)s)"


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagoda", description="Self-hosted LLM serving.")
    parser.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING, ERROR.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if a in SUBCOMMANDS), None)
    for name, (module, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(
            name, help=help_text, description=help_text, formatter_class=_DefaultsFormatter
        )
        if name == chosen:  # only the chosen one pays for its imports
            importlib.import_module(module).add_arguments(sub_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Before torch is imported (it reads this once): large CPU tensors, the model
    # weights among them, go in transparent huge pages, which cuts TLB misses.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    args = build_parser(argv).parse_args(argv)
    configure_logging(args.log_level)
    for note in getattr(args, NOTES, None) or ():
        get_logger("shared.cli").warning("%s", note)
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
