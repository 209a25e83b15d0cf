import sys, traceback
sys.path.insert(0, "tests")
import numpy as np, cupy
from test_launch_scratch import _context, _write_kwargs, _kernel_write, LENGTHS, SEEDS, TOKENS, POSITIONS, SLOTS
from kernel_pairs import to_device
from kvcanary_numba.fast import chain as chain_glue
chain_glue.OWN_TILED_MIN_TOKENS = 8
def trial(label, refused):
    marker = cupy.zeros(1, dtype=cupy.int64); marker += 1
    ctx = to_device(_context(), "cuda")
    args = {n: to_device(v, "cuda") for n, v in _write_kwargs().items()}
    stream = cupy.cuda.Stream(non_blocking=True)
    print(label, "stream", hex(stream.ptr), "current before", hex(cupy.cuda.get_current_stream().ptr))
    with stream:
        stream.begin_capture()
        try:
            marker += 1
            print("  capturing after marker:", stream.is_capturing(), "current", hex(cupy.cuda.get_current_stream().ptr))
            if refused:
                try:
                    _kernel_write(ctx, args)
                    print("  no error")
                except Exception as e:
                    print("  raised", type(e).__name__, getattr(e, "code", None), str(e)[:300])
                print("  capturing after call:", stream.is_capturing(), "current", hex(cupy.cuda.get_current_stream().ptr))
        finally:
            try:
                g = stream.end_capture()
                print("  graph", g)
                g.launch(stream)
            except Exception as e:
                print("  end/launch raised", type(e).__name__, e)
    stream.synchronize()
    print("  marker", int(marker[0]))
for label, refused in (("plain", False), ("refused", True), ("plain again", False)):
    try: trial(label, refused)
    except Exception: traceback.print_exc()
