"""Not yet run (no device time left in session 2): random vs sequential gathers of 32 / 64 / 128-byte
rows. If random 32-byte rows cost as much per row as 64-byte rows, HBM serves 64 bytes per random access
and verify with random slots is capped near 64 % of copy bandwidth under the 32-byte byte model
(see benchmarks/NOTES.md). Run: python3 probe_gather_granularity.py out.json (CuPy only)."""
import json, sys, cupy, numpy as np
rows = 1 << 25  # 32 M rows per table
out = {}
for width in (4, 8, 16):  # int64 words per row: 32, 64, 128 bytes
    table = cupy.arange(rows * width, dtype=cupy.int64).reshape(rows, width)
    n = 1 << 22
    for layout in ("random", "sequential"):
        idx = cupy.random.permutation(rows)[:n] if layout == "random" else cupy.arange(n)
        dst = cupy.empty((n, width), dtype=cupy.int64)
        k = cupy.ElementwiseKernel("raw int64 t, raw int64 idx, int64 w", "int64 y", "y = t[idx[i / w] * w + i % w]", "g")
        for _ in range(3): k(table, idx, width, dst)
        s, e = cupy.cuda.Event(), cupy.cuda.Event(); ts = []
        for _ in range(10):
            s.record(); k(table, idx, width, dst); e.record(); e.synchronize(); ts.append(cupy.cuda.get_elapsed_time(s, e) * 1e3)
        us = float(np.median(ts)); useful = n * (width * 8 * 2 + 8)
        out[f"{layout} {width*8} B rows"] = {"us": round(us, 1), "useful_gbps": round(useful / us / 1e3, 1),
                                           "rows_per_us": round(n / us, 1)}
        print(layout, width * 8, out[f"{layout} {width*8} B rows"], flush=True)
    del table
json.dump(out, open(sys.argv[1], "w"), indent=1)
