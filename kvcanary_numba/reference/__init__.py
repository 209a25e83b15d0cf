"""The executable specification of every operation, in plain NumPy and Python.

One module per operation, each readable next to its Numba-CUDA kernel in
:mod:`kvcanary_numba.kernels`: the same checks in the same order. Plain Python
loops where they read best (verify's per-entry checks, the write chain, which
is serial per request), vectorised NumPy where that reads as clearly (the
plan, the fingerprint's byte gather, scatter, budget). No compiled code:
performance is secondary to being read (a few thousand entries take well
under a second). The rules for values the engine should
never produce are in ``docs/concepts/semantics.md``.
"""
