#!/usr/bin/env bash
# Emulated AVX2-only CPU (e.g. an AVX2 AMD EPYC, Zen 2/3) on an AVX-512 machine.
#
#   source bench/avx2_env.sh            # then any pagoda / bench command
#   bench/avx2_env.sh pagoda bench ...  # or run one command under it
#
# Every layer that would otherwise pick AVX-512 is capped at AVX2 (check with
# `python -m bench.isa_caps`, which prints what each layer picked):
# - Pagoda's kernels: built as x86-64-v3 (AVX2, FMA, F16C), their own build and
#   module name; the engine then treats bf16 as slow and computes in float32.
# - PyTorch's own vectorised ops (ATen): its AVX2 kernel set.
# - oneDNN (the packed float32 linears, both engines): AVX2 brgemm/jit kernels.
# - MKL: asked for AVX2. MKL ignores it on AMD CPUs, where it never takes its
#   AVX-512 paths anyway (bench.isa_caps times its sgemm to show it).
# Not emulated: the AVX2 machine's memory system (bandwidth, cache sizes and
# latency), its core count and clocks, and an AVX2 core's narrower FP datapath
# (Zen 3 has 4 x 256-bit FP pipes, Zen 5 runs 256-bit code on 512-bit ones).
export PAGODA_CPU_ISA=avx2
export ATEN_CPU_CAPABILITY=avx2
export ONEDNN_MAX_CPU_ISA=AVX2
export MKL_ENABLE_INSTRUCTIONS=AVX2
# vLLM CPU picks _C / _C_AVX512 / _C_AVX2 by asking torch.cpu, which reads
# CPUID: bench/avx2_site/sitecustomize.py makes it answer as an AVX2-only CPU
# (so vLLM loads _C_AVX2); its float32 linears are its own oneDNN, capped above.
_avx2_site="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/avx2_site"
export PYTHONPATH="$_avx2_site${PYTHONPATH:+:$PYTHONPATH}"
unset _avx2_site
if [ "$#" -gt 0 ]; then
    exec "$@"
fi
