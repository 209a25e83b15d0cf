"""The optimised CPU path: the NumPy specifications (:mod:`kvcanary_numba.reference`) compiled
with Numba for many cores (``prange`` chunks, loops compiled twice for one and many chunks).

Tests compare each function here with its specification, as they compare the kernels.
"""
