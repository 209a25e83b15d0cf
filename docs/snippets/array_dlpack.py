"""An object that offers only DLPack (concepts/array-libraries.md)."""

from array_step import EXPECTED, ring, skip_without_gpu, two_steps

skip_without_gpu()
# --8<-- [start:dlpack]
import cupy


class DlpackOnly:
    """What some frameworks hand out: ``__dlpack__``, ``__dlpack_device__``, no more."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


ctx = two_steps(lambda a: DlpackOnly(cupy.asarray(a)))
cupy.cuda.runtime.deviceSynchronize()
print(ring(ctx, lambda a: cupy.asnumpy(cupy.from_dlpack(a))))
# --8<-- [end:dlpack]
assert ring(ctx, lambda a: cupy.asnumpy(cupy.from_dlpack(a))) == EXPECTED
