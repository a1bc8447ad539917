"""On PYTHONPATH (bench/avx2_env.sh puts it there): torch.cpu answers as an AVX2-only CPU.

vLLM CPU picks its kernel library by asking torch.cpu at start-up
(vllm/platforms/cpu.py, import_kernels): `_C` where `_is_avx512_bf16_supported()`,
`_C_AVX512` where `_is_avx512_supported()`, else `_C_AVX2`; its attention
backend, its small-GEMM and MoE paths ask the same functions. Those read CPUID,
not ATEN_CPU_CAPABILITY, so on an AVX-512 machine vLLM would run its AVX-512
kernels under the emulation. Here they say False, whatever the CPU has, so
vLLM loads `_C_AVX2` and takes the paths it takes on an AVX2-only EPYC.

Lazily: torch is patched when something imports it, not at every interpreter
start. Pagoda never reads these functions (PAGODA_CPU_ISA picks its builds).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

# The CPU features an AVX2-only x86 CPU lacks, as torch.cpu names them.
_ABSENT = (
    "_is_avx512_supported",
    "_is_avx512_bf16_supported",
    "_is_vnni_supported",
    "_is_amx_tile_supported",
    "_is_amx_fp16_supported",
)


def _absent() -> bool:
    return False


class _TorchCpuAsAvx2(importlib.abc.MetaPathFinder):
    """Finds `torch.cpu` as usual, then sets _ABSENT to False once it has run."""

    def find_spec(self, name, path, target=None):
        if name != "torch.cpu":
            return None
        sys.meta_path.remove(self)  # find the real module, once
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            for feature in _ABSENT:
                setattr(module, feature, _absent)

        spec.loader.exec_module = exec_module
        return spec


if "torch.cpu" in sys.modules:  # imported before site ran (not in practice)
    for _feature in _ABSENT:
        setattr(sys.modules["torch.cpu"], _feature, _absent)
else:
    sys.meta_path.insert(0, _TorchCpuAsAvx2())
