"""The executable specification of every operation, in plain NumPy and Python.

One module per operation, each readable next to its Numba-CUDA kernel in
:mod:`kvcanary_numba.kernels`: the same checks in the same order, with loops
where the kernel's work is serial (the write chain) and vectorised NumPy where
that reads as clearly (the plan, the fingerprint gather). No compiled code:
performance is secondary to being read. The rules for values the engine should
never produce are in ``docs/concepts/semantics.md``.
"""
