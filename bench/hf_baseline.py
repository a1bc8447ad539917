"""`pagoda bench offline --baseline hf-static --batch B`: plain `transformers` generate.

The baseline every speed claim is a ratio against, measured in the same run:
requests in workload order, in static batches of B, each batch left-padded to
its longest prompt and generated greedily for the batch's longest max_tokens
(`min_new_tokens` = `max_new_tokens`, so EOS never ends a batch early):

    batch of 3 (P = prompt, O = own output, . = padding, x = beyond own max_tokens)
        . . P P P | O O x x
        P P P P P | O O O O
        . P P P P | O x x x

Only useful tokens count towards throughput: each request's prompt and its own
max_tokens, as for every other engine. padding_waste is the share of all slots
(prompt region + generated region, over all batches) that were `.` or `x`.
The compute dtype follows our engine's `--dtype` rule (worker/runner/platform.py),
so the baseline and the engine do the same arithmetic.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from bench.jsonl import emit
from bench.machine import describe_machine
from bench.offline_result import OfflineResult
from bench.workloads import BenchRequest, Workload, resolve_workloads
from worker.config import EngineConfig


@dataclass(frozen=True)
class StaticRun:
    elapsed_s: float
    num_slots: int  # batch rows x (longest prompt + longest output), summed over batches
    num_useful_slots: int  # sum of each request's prompt + its own max_tokens


def generate_static(model, requests: tuple[BenchRequest, ...], batch_size: int, pad_id: int):
    """Run `requests` in static batches through `model.generate`; timed, batch by batch."""
    import torch

    elapsed, num_slots, num_useful = 0.0, 0, 0
    for first in range(0, len(requests), batch_size):
        batch = requests[first : first + batch_size]
        prompt_len = max(len(r.prompt_token_ids) for r in batch)
        new_tokens = max(r.max_tokens for r in batch)
        input_ids = torch.full((len(batch), prompt_len), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), prompt_len), dtype=torch.long)
        for row, request in enumerate(batch):  # left padding: prompts end together
            n = len(request.prompt_token_ids)
            input_ids[row, prompt_len - n :] = torch.tensor(request.prompt_token_ids)
            attention_mask[row, prompt_len - n :] = 1
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                input_ids,
                attention_mask=attention_mask,
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=pad_id,
            )
        elapsed += time.perf_counter() - start
        # [num_seqs, prompt_len + new_tokens]
        if out.shape[1] != prompt_len + new_tokens:
            raise RuntimeError(f"generate returned {out.shape[1] - prompt_len} of {new_tokens}")
        num_slots += len(batch) * (prompt_len + new_tokens)
        num_useful += sum(len(r.prompt_token_ids) + r.max_tokens for r in batch)
    return StaticRun(elapsed, num_slots, num_useful)


def load_model(config: EngineConfig):
    """The checkpoint in `transformers`, in the dtype our engine would choose; returns
    (model, torch dtype)."""
    from transformers import AutoModelForCausalLM

    from worker.models.loader import resolve_model_path
    from worker.models.spec import ModelSpec
    from worker.runner.platform import configure_cpu_threads, resolve_device, resolve_dtype

    path = resolve_model_path(config.model.model, config.model.revision)
    device = resolve_device(config.device)
    if device.type == "cpu":
        configure_cpu_threads(config.device)
    dtype = resolve_dtype(config.model, ModelSpec.from_folder(path), device)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    return model, dtype


def run_hf_static(
    model, dtype, workload: Workload, batch_size: int, model_name: str
) -> OfflineResult:
    pad_id = model.config.pad_token_id
    if pad_id is None:
        pad_id = 0  # masked out; any id in the vocabulary will do
    run = generate_static(model, workload.requests, batch_size, pad_id)
    return OfflineResult(
        engine=f"hf-static-B{batch_size}",
        model=model_name,
        workload=workload.name,
        seed=workload.seed,
        requests=len(workload.requests),
        prompt_tokens=workload.num_prompt_tokens,
        output_tokens=workload.num_output_tokens,
        elapsed_s=run.elapsed_s,
        dtype=str(dtype).removeprefix("torch."),
        padding_waste=1 - run.num_useful_slots / run.num_slots,
        flags=[f"--batch={batch_size}"],
        machine=describe_machine(),
    )


def main(args: argparse.Namespace, config: EngineConfig) -> int:
    if args.baseline != "hf-static":
        raise SystemExit(f"unknown baseline {args.baseline!r}; the one there is: hf-static")
    model, dtype = load_model(config)
    vocab_size = model.config.vocab_size
    workloads = resolve_workloads(args.workload, args.seed, vocab_size, args.num_requests)
    # One short request first: the first call's one-time costs are not timed.
    first = workloads[0].requests[0]
    generate_static(model, (BenchRequest(first.prompt_token_ids[:16], 4),), 1, pad_id=0)
    for workload in workloads:
        for batch_size in args.batch:
            result = run_hf_static(model, dtype, workload, batch_size, config.model.model)
            emit(result.to_json(), args.output)
    return 0
