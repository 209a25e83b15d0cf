"""CUDA launch glue: one module per operation, called by the public wrappers.

``launch/<op>.py`` turns validated arguments (CUDA arrays, or NumPy arrays under
Numba's CUDA simulator) into kernel arguments, picks the compile-time variant
and the grid, and launches on CuPy's current stream. Shared helpers are in
:mod:`kvcanary_numba.launch._common`.
"""
