"""Compute kernels, each beside its plain-PyTorch reference twin.

The `*_reference` functions are the CPU fallback and the oracle that every
optimized kernel is tested against.
"""
