"""CUDA launch glue: one module per operation, called by the operation modules' ``run``.

``launch/<op>.py`` turns validated arguments (CUDA arrays, or NumPy arrays under
Numba's CUDA simulator) into kernel arguments, picks the compile-time variant
and the grid, and launches on the call's stream through
:func:`kvcanary_numba.launch._launch.launch` (numba-cuda's public
``kernel[grid, block, stream](*args)``).
"""
