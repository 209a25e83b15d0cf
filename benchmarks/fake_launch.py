"""The fast wing's raw launches as on a GPU, over NumPy arrays under Numba's CUDA simulator, driver calls stubbed.

Under the simulator the fast wing never packs, refills or replays a launch (its driver's
``raw`` is False: every launch runs through the simulator), so the host work of the eager
GPU path -- the launch glue, each eager launch's refill of its packed parameters, the memo
replay of repeated calls -- is not what a CPU run measures. :func:`gpu_launch_layer` swaps
in a driver that takes the GPU branches on a CPU:

- raw launches on (packing, eager refill, replay); grids and launch shapes keep the
  simulator's (the core's ``ON_SIMULATOR`` is untouched);
- each kernel and signature gets a fake driver handle (an int), and the declared signature's
  Numba types stand for the compiled kernel's argument types;
- a do-nothing ``cuLaunchKernel`` (``host_step.stub_launches`` times what a raw launch does
  before the call);
- launch scratch stays NumPy, as under the simulator;
- the public calls' snapshots key a top-level NumPy array by its object (a token), as on a GPU
  a top-level CuPy array is keyed by its pointer: the memo leaves out NumPy pointers (a NumPy
  call never replays), and a replay here launches on pointers.

Nothing reaches a GPU and no kernel runs: only host time means anything in this mode
(``benchmarks/host_step.py --path eager``).
"""

from __future__ import annotations

__all__ = ["StubDriver", "gpu_launch_layer"]


def _stub_driver_class():
    from kvcanary_numba.fast.driver import Driver
    from kvcanary_numba.launch._launch import _declared_types

    class StubDriver(Driver):
        """A driver that launches nothing: handles are ints, argument types the declared signature's."""

        def __init__(self):
            super().__init__(raw=True)
            self.handles: dict[tuple, int] = {}

        def function_handle(self, kernel, signature):
            return self.handles.setdefault((id(kernel), signature), 0x1000 + len(self.handles))

        def argument_types(self, kernel, signature):
            return _declared_types(signature)

        def check_types(self, kernel, signature, args):
            return None

        def current_device(self):
            return 0

        def select(self, handle=None, load=None):
            self.ready = True  # native stays None: launch tables loop in Python over launch()

        def check_abi(self, handle, sizes):
            return None  # as a driver that cannot tell: kernelParams, no one-buffer form

        def launch(self, func, grid, block, stream, params) -> None:
            pass

    return StubDriver


def StubDriver():  # noqa: N802 - a class built on first use (it subclasses the package's Driver)
    return _stub_driver_class()()


def gpu_launch_layer():
    """Swap in the GPU branches (see the module docstring); returns a restorer."""
    import numpy as np

    from kvcanary_numba.fast import driver as _driver, memo as _memo

    snapshot = _memo.snapshot

    def by_object(values: tuple):
        # Held in a tuple, a NumPy array is walked at depth 1: its token joins its layout.
        return snapshot(tuple((v,) if type(v) is np.ndarray else v for v in values))

    patches = [(_driver, "driver", StubDriver()), (_memo, "snapshot", by_object)]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    for obj, name, value in patches:
        setattr(obj, name, value)

    def restore() -> None:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)

    return restore
