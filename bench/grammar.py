"""What constrained decoding costs: compile time, bitmask cost per step, and the
engine's decode step and throughput with none, a quarter or all requests constrained.

    PYTHONPATH=$PWD python -m bench.grammar [--requests 64 --max-tokens 12 --repeats 2]

One process, one SmolLM2-135M-shaped random checkpoint (vocabulary 49152; its
BPE tokenizer is trained on a tiny corpus and padded with added tokens, so most
entries are those). The three engine runs alternate (none, quarter, all, none,
...) so that a change in machine load hits each alike; figures are medians. The
runner's grammar work (bitmask fill + apply) is timed inside each decode step,
so its share of the step is measured in the same step, whatever the load.
The schema asks for at least 20 array items, so no constrained request ends
before --max-tokens and every step runs the whole batch.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CHECKPOINT = REPO_ROOT / "bench" / "results" / "tmp" / "smollm2-135m-shaped-tokenizer"
LONG_SCHEMA = {
    "type": "object",
    "properties": {
        "people": {
            "type": "array",
            "minItems": 20,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "pattern": "^[a-z ]{1,12}$"},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "admin": {"type": "boolean"},
                },
                "required": ["name", "age", "admin"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["people"],
}


def compile_times(path: Path, vocab_size: int, eos: tuple[int, ...]) -> dict[str, float]:
    """Milliseconds to compile each test constraint, each with the caches empty."""
    from router.tools.tool_choice import tool_choice
    from shared.structured_outputs import StructuredOutputsParams as S
    from tests.router.tools.conversation import TOOLS
    from tests.worker.structured.schemas import CHOICES, GRAMMAR, PERSON, POINTS, REGEX
    from worker.structured.compiler import GrammarCompiler

    required = tool_choice(TOOLS, "required", True, False).constraint()
    constraints = {
        "person_schema": S.from_schema(PERSON),
        "points_schema": S.from_schema(POINTS),
        "json_object": S(json_object=True),
        "regex": S(regex=REGEX),
        "choice": S(choice=CHOICES),
        "grammar": S(grammar=GRAMMAR),
        "tools_required": required,
        "bench_schema": S.from_schema(LONG_SCHEMA),
    }
    compiler = GrammarCompiler(path, vocab_size, eos)
    start = time.perf_counter()
    compiler.compile(S(regex="x"))  # tokenizer info + xgrammar import, once per worker
    result = {"tokenizer_info_and_first_compile": 1000 * (time.perf_counter() - start)}
    for name, constraint in constraints.items():
        compiler.clear_cache()
        start = time.perf_counter()
        compiler.compile(constraint)
        result[name] = 1000 * (time.perf_counter() - start)
    return result


def bitmask_cost(compiled, vocab_size: int, num_rows: int, repeats: int = 20) -> dict[str, float]:
    """Milliseconds to fill `num_rows` bitmask rows and to apply them to float32 logits
    (the per-step work constrained rows add), matchers a few tokens into the schema."""
    import torch

    from worker.structured.bitmask import apply_bitmask, fill_bitmask
    from worker.structured.grammar_state import GrammarState

    states = [GrammarState(compiled) for _ in range(num_rows)]
    for state in states:  # into the array, where the mask is widest
        for _ in range(8):
            bitmask = fill_bitmask([state], vocab_size)
            logits = torch.randn(1, vocab_size)
            apply_bitmask(logits, bitmask, [0])
            state.accept(int(logits.argmax()))
    logits = torch.randn(num_rows, vocab_size)
    fills, applies = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        bitmask = fill_bitmask(states, vocab_size)
        fills.append(time.perf_counter() - start)
        start = time.perf_counter()
        apply_bitmask(logits, bitmask, list(range(num_rows)))
        applies.append(time.perf_counter() - start)
    return {
        "fill_ms": 1000 * statistics.median(fills),
        "apply_ms": 1000 * statistics.median(applies),
    }


class GrammarTimer:
    """Times the runner's per-step grammar work (bitmask fill + apply) beside each step."""

    def __init__(self) -> None:
        import worker.runner.model_runner as runner_module

        self.seconds = 0.0
        self._module = runner_module
        self._originals = {n: getattr(runner_module, n) for n in ("fill_bitmask", "apply_bitmask")}
        for name, fn in self._originals.items():
            setattr(runner_module, name, self._timed(fn))

    def close(self) -> None:
        for name, fn in self._originals.items():
            setattr(self._module, name, fn)

    def _timed(self, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            self.seconds += time.perf_counter() - start
            return out

        return wrapper


def engine_run(
    llm, prompts, num_constrained: int, max_tokens: int, timer: GrammarTimer
) -> dict[str, float]:
    """Median decode step, its median share spent on grammars, and total output tok/s
    with the first `num_constrained` requests constrained."""
    from shared.structured_outputs import StructuredOutputsParams
    from worker import SamplingParams

    free = SamplingParams(temperature=1.0, seed=1, max_tokens=max_tokens, ignore_eos=True)
    constrained = SamplingParams(
        temperature=1.0, seed=1, max_tokens=max_tokens, ignore_eos=True,
        structured_outputs=StructuredOutputsParams.from_schema(LONG_SCHEMA),
    )  # fmt: skip
    params = [constrained] * num_constrained + [free] * (len(prompts) - num_constrained)
    marks: list[tuple[float, float]] = []  # (step end, grammar seconds so far)

    def on_step(_) -> None:
        marks.append((time.perf_counter(), timer.seconds))

    start = time.perf_counter()
    outs = llm.generate(prompts, params, detokenize=False, on_step=on_step)
    elapsed = time.perf_counter() - start
    num_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    assert num_tokens == len(prompts) * max_tokens, "a request ended early"
    steps = list(itertools.pairwise(marks[1:]))  # decode steps only
    return {
        "step_ms": 1000 * statistics.median(b[0] - a[0] for a, b in steps),
        "grammar_share": statistics.median((b[1] - a[1]) / (b[0] - a[0]) for a, b in steps),
        "tok_s": num_tokens / elapsed,
    }


def main(args: argparse.Namespace | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    args = parser.parse_args() if args is None else args

    import torch

    from bench.checkpoints import SMOLLM2_135M_SHAPE, build_random_checkpoint
    from bench.machine import describe_machine
    from shared.logging import configure_logging
    from shared.structured_outputs import StructuredOutputsParams
    from worker import LLM

    configure_logging("WARNING")
    if not (args.checkpoint / "config.json").exists():
        build_random_checkpoint(
            args.checkpoint, "llama", dtype=torch.bfloat16, initializer_range=0.02,
            **SMOLLM2_135M_SHAPE,
        )  # fmt: skip
    vocab_size = SMOLLM2_135M_SHAPE["vocab_size"]
    llm = LLM(str(args.checkpoint), max_model_len=512, kv_cache_memory=2**30)
    eos = llm.engine.spec.eos_token_ids
    result: dict = {
        "machine": describe_machine(),
        "compile_ms": compile_times(args.checkpoint, vocab_size, eos),
    }
    compiled = llm.engine.grammars.compile(StructuredOutputsParams.from_schema(LONG_SCHEMA))
    result["bitmask_64_rows"] = bitmask_cost(compiled, vocab_size, 64)
    generator = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, vocab_size, (args.prompt_len,), generator=generator).tolist()
        for _ in range(args.requests)
    ]
    mixes = {"none": 0, "quarter": args.requests // 4, "all": args.requests}
    timer = GrammarTimer()
    engine_run(llm, prompts[:4], 4, 4, timer)  # warm up, constrained path included
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in mixes}
    for _ in range(args.repeats):
        for name, num in mixes.items():
            runs[name].append(engine_run(llm, prompts, num, args.max_tokens, timer))
    keys = ("step_ms", "grammar_share", "tok_s")
    result["engine"] = {
        name: {key: statistics.median(r[key] for r in rs) for key in keys}
        for name, rs in runs.items()
    }
    engine = result["engine"]
    result["ratios"] = {
        "step_all_over_none": engine["all"]["step_ms"] / engine["none"]["step_ms"],
        "step_quarter_over_none": engine["quarter"]["step_ms"] / engine["none"]["step_ms"],
        "tok_s_quarter_over_none": engine["quarter"]["tok_s"] / engine["none"]["tok_s"],
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
