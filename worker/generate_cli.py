"""`pagoda generate MODEL --prompt ...`: offline generation from the command line."""

from __future__ import annotations

import argparse
import json

from shared.errors import ConfigError
from shared.logging import get_logger
from worker.config import EngineConfig

logger = get_logger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prompt", action="append", required=True, help="Prompt text (repeatable)."
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--json", action="store_true", help="Print one JSON object per prompt.")
    EngineConfig.add_cli_args(parser)


def run(args: argparse.Namespace) -> int:
    from shared.sampling_params import SamplingParams
    from worker.llm import LLM

    try:
        llm = LLM(config=EngineConfig.from_cli_args(args))
    except ConfigError as exc:
        logger.error("%s", exc)
        return 2
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    try:
        outputs = llm.generate(args.prompt, params)
    finally:
        llm.shutdown()
    for prompt, output in zip(args.prompt, outputs):
        completion = output.outputs[0]
        if args.json:
            record = {
                "prompt": prompt,
                "text": completion.text,
                "token_ids": completion.token_ids,
                "finish_reason": completion.finish_reason,
            }
            print(json.dumps(record))
        else:
            print(f"{prompt}{completion.text}")
    return 0
