from __future__ import annotations

from bench.grammar import LONG_SCHEMA, GrammarTimer, bitmask_cost, compile_times, engine_run
from shared.structured_outputs import StructuredOutputsParams
from tests.conftest import random_prompts
from worker import LLM


def test_the_bench_measures_on_a_tiny_model(make_checkpoint):
    path = make_checkpoint("llama")
    times = compile_times(path, 512, (2,))
    assert set(times) >= {"person_schema", "tools_required", "bench_schema"}
    assert all(t > 0 for t in times.values())
    llm = LLM(str(path), block_size=4, max_model_len=128, num_kv_blocks=256)
    compiled = llm.engine.grammars.compile(StructuredOutputsParams.from_schema(LONG_SCHEMA))
    assert set(bitmask_cost(compiled, 512, 4, repeats=2)) == {"fill_ms", "apply_ms"}
    # Every request runs to max_tokens (the schema cannot end sooner), constrained or not.
    timer = GrammarTimer()
    try:
        prompts = random_prompts([4] * 4)
        run = engine_run(llm, prompts, num_constrained=2, max_tokens=6, timer=timer)
        free = engine_run(llm, prompts, num_constrained=0, max_tokens=6, timer=timer)
    finally:
        timer.close()
    assert run["step_ms"] > 0 and run["tok_s"] > 0 and 0 < run["grammar_share"] < 1
    assert free["grammar_share"] == 0
