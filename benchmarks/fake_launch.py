"""The launch layer as on a GPU, over NumPy arrays under Numba's CUDA simulator, driver calls stubbed.

Under the simulator the launch layer runs every kernel through Numba's simulator and
never packs, refills or replays a launch (``_kernel_launch.run_launches`` and
``run_spec`` bypass it), so the host work of the eager GPU path -- the launch glue,
each eager launch's refill of its packed parameters, the memo replay of repeated
calls -- is not what a CPU run measures. :func:`gpu_launch_layer` makes that layer
take its GPU branches on a CPU:

- ``ON_SIMULATOR`` is off in ``_common`` and ``_kernel_launch`` (packing, eager
  refill, replay); grids and launch shapes keep the simulator's (``_compile``);
- each kernel and signature gets a fake driver handle (an int) and a stand-in for
  its compiled kernel whose argument types are the declared signature's (what
  ``PreparedLaunch`` packs from); the first launch of each kernel checks the glue's
  argument types (``numba.typeof``, as the simulator does);
- a do-nothing driver (no route call is made: ``PreparedLaunch.launch`` is stubbed by
  ``host_step.stub_launches`` to the stream lookup a raw launch does before it);
- launch scratch (the plan's) stays NumPy (device 0, stream 0), as under the simulator;
- the public calls' snapshots key a top-level NumPy array by its object (a token), as
  on a GPU a top-level CuPy array is keyed by its pointer: the public memo leaves out
  NumPy pointers (a NumPy call never replays), and a replay here launches on pointers.

Nothing reaches a GPU and no kernel runs: only host time means anything in this mode
(``benchmarks/host_step.py --path eager``).
"""

from __future__ import annotations

import threading

__all__ = ["gpu_branches", "gpu_launch_layer"]


class _Compiled:
    """A compiled kernel's stand-in: its argument types (Numba types of the declared signature)."""

    def __init__(self, signature: str):
        from kvcanary_numba.launch import _common

        self.argument_types = _common._declared_types(signature)


class _Driver:
    """The driver of raw launches, doing nothing: route, handle and parameter arguments as on ctypes."""

    route, native = "ctypes", None

    def select(self, handle, preference=None, load=None) -> str:
        return self.route

    def func_arg(self, handle):
        return handle

    def params_arg(self, address: int):
        return address

    def check_abi(self, handle, sizes):
        return None  # as a driver that cannot tell: kernelParams, no one-buffer form

    def launch(self, func, grid, block, stream, params) -> None:
        pass


def gpu_branches(function_handle, compile_kernel, driver) -> list[tuple]:
    """(module, attribute, value) of every switch that makes the launch layer take its GPU
    branches on a CPU: simulator flags off, kernel handles and compiled kernels from the given
    stand-ins, device 0, a fresh per-thread cache of packed eager launches, ``driver`` for raw
    launches and launch tables. Shared with the tests' ``gpu`` fixture (``tests/launch_fakes.py``),
    so a new switch of the launch layer is learnt by both fakes at once."""
    from kvcanary_numba.launch import _common, _kernel_launch, prepared, table

    return [
        (_common, "ON_SIMULATOR", False),
        (_kernel_launch, "ON_SIMULATOR", False),
        (_common, "function_handle", function_handle),
        (_common, "compile_kernel", compile_kernel),
        (_kernel_launch, "compile_kernel", compile_kernel),
        (_kernel_launch, "_current_device", lambda: 0),
        (_kernel_launch, "_eager", threading.local()),  # packed eager launches of this run only
        (prepared, "_driver", driver),
        (table, "_driver", driver),
    ]


def gpu_launch_layer():
    """Switch the launch layer to its GPU branches (see the module docstring); returns a restorer."""
    from kvcanary_numba import _memo
    from kvcanary_numba.launch import scratch

    handles: dict[tuple, int] = {}
    compiled: dict[tuple, _Compiled] = {}

    def function_handle(kernel, signature):
        return handles.setdefault((id(kernel), signature), 0x1000 + len(handles))

    def compile_kernel(kernel, signature):
        key = (id(kernel), signature)
        if key not in compiled:
            compiled[key] = _Compiled(signature)
        return compiled[key]

    patches = [
        *gpu_branches(function_handle, compile_kernel, _Driver()),
        # Launch scratch as under the simulator (NumPy, one key), not cuda.to_device.
        (scratch, "scratch_arrays", lambda: scratch._scratch.setdefault((-1, 0), {})),
        (scratch, "zeros", _numpy_zeros),
        (_memo, "snapshot", _objects_snapshot(_memo.snapshot)),
    ]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    for obj, name, value in patches:
        setattr(obj, name, value)

    def restore() -> None:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)

    return restore


def _numpy_zeros(scratch: dict, name: str, shape: tuple, dtype):
    import numpy as np

    key = (name, shape, np.dtype(dtype).str)
    hit = scratch.get(key)
    if hit is None:
        hit = scratch[key] = np.zeros(shape, dtype=dtype)
    return hit


def _objects_snapshot(snapshot):
    import numpy as np

    def by_object(values: tuple):
        # Held in a tuple, a NumPy array is walked at depth 1: its token joins its layout.
        return snapshot(tuple((v,) if type(v) is np.ndarray else v for v in values))

    return by_object
