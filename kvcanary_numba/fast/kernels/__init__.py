"""The fast wing's kernels: ``@cuda.jit`` only, built from the core's device functions.

What the monitor's steps and the fast public write launch besides the core kernels: the
write with a chain shared by one step's launches (``write_shared``, ``share``), the verify
and write of every endpoint of a phase in one launch (``endpoints``, ``tiled_endpoints``,
``parts``), the chain alone (``chain``) and the tiled stamp of long writes
(``write_tiled``), the SWA slot translation (``translate``) and the token scatter with its
valid lengths (``scatter_lens``). Each module declares ``KERNELS`` and ``SIGNATURES`` as
:mod:`kvcanary_numba.kernels` does. The core (``kvcanary_numba/kernels/``) never imports
these modules.
"""
