"""Session 3: what the H200 itself allows for verify's random-slot layout, with no hashing at all.

Pure-load kernels (CuPy RawKernel, 16-byte vector loads, 4 independent rows in flight per thread,
rows read by consecutive lanes so each row's bytes come from one instruction) read, per item:
`rows W`: an 8-byte index (sequential) and one W-byte row at that index (random or sequential);
`verify NONE`: 24 plan bytes (sequential) and the item's 32-byte record;
`verify ALL`: the same plus the slot's 128-byte KV row (a second table).
Bandwidth is counted like benchmarks/NOTES.md's byte models (useful bytes only) and compared with a
device-to-device copy measured in the same run. Run: python3 probe_gather_limits.py out.json"""
import json, sys
import cupy, numpy as np

SRC = r"""
extern "C" __global__ void gather(const long long* __restrict__ idx, const ulonglong2* __restrict__ rows, int row_vecs,
                                  const long long* __restrict__ plan, int plan_words,
                                  const ulonglong2* __restrict__ kv, int kv_vecs,
                                  long long n, unsigned long long* __restrict__ out) {
    // lanes cover consecutive 16-byte vectors of consecutive items; each thread keeps 4 items in flight
    int need = max(max(row_vecs, kv_vecs), plan_words);
    int shift = need <= 1 ? 0 : 32 - __clz(need - 1);  // lanes per item: a power of two, no division
    int per_item = 1 << shift;
    long long nthreads = (long long)gridDim.x * blockDim.x;
    long long total = n * per_item;
    unsigned long long acc = 0;
    for (long long base = (long long)blockIdx.x * blockDim.x + threadIdx.x; base < total; base += 4 * nthreads) {
        ulonglong2 v[4], w[4]; long long p[4];
        #pragma unroll
        for (int u = 0; u < 4; ++u) {
            long long e = base + u * nthreads;
            v[u] = make_ulonglong2(0, 0); w[u] = v[u]; p[u] = 0;
            if (e < total) {
                long long item = e >> shift; int vec = (int)(e & (per_item - 1));
                long long r = idx[item];
                if (vec < row_vecs) v[u] = rows[r * row_vecs + vec];
                if (vec < kv_vecs) w[u] = kv[r * kv_vecs + vec];
                if (vec < plan_words) p[u] = plan[item * plan_words + vec];
            }
        }
        #pragma unroll
        for (int u = 0; u < 4; ++u) acc ^= v[u].x + v[u].y + w[u].x + w[u].y + (unsigned long long)p[u];
    }
    out[(long long)blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
"""
kernel = cupy.RawKernel(SRC, "gather")
dev = cupy.cuda.Device()
sms = dev.attributes["MultiProcessorCount"]
BLOCK, GRID = 256, sms * 8
sink = cupy.empty(BLOCK * GRID, dtype=cupy.uint64)

ITERS = int(__import__("os").environ.get("PROBE_ITERS", 20))  # 1 under ncu: one profiled launch per case


def time_us(fn, iters=ITERS):
    for _ in range(min(3, iters)): fn()
    ts = []
    for _ in range(iters):
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        s.record(); fn(); e.record(); e.synchronize(); ts.append(cupy.cuda.get_elapsed_time(s, e) * 1e3)
    return float(np.median(ts))

src = cupy.empty(1 << 30, dtype=cupy.uint8); dst = cupy.empty_like(src)
copy_us = time_us(lambda: cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, 3, 0))
copy_gbps = 2 * src.nbytes / copy_us / 1e3
del src, dst
out = {"copy_gbps": round(copy_gbps, 1), "grid": [GRID, BLOCK], "cases": []}
print(out, flush=True)
POOL = 1 << 25  # rows per table: 32 M (1 GiB of 32-byte records, 4 GiB of 128-byte KV rows)
N = 1 << 22
records = cupy.zeros(POOL * 4, dtype=cupy.uint64)  # 32 B rows (2 vectors each)
kvrows = cupy.zeros(POOL * 16, dtype=cupy.uint64)  # 128 B rows
plan = cupy.zeros(N * 3, dtype=cupy.int64)
zero = cupy.zeros(2, dtype=cupy.uint64)
for layout in ("random", "sequential"):
    idx = (cupy.random.permutation(POOL)[:N] if layout == "random" else cupy.arange(N)).astype(cupy.int64)
    specs = {  # name: (row table, row vecs, plan words, kv table, kv vecs, useful bytes per item)
        "rows 32 B": (records, 2, 0, zero, 0, 8 + 32),
        "rows 64 B": (kvrows, 4, 0, zero, 0, 8 + 64),
        "rows 128 B": (kvrows, 8, 0, zero, 0, 8 + 128),
        "verify NONE (plan 24 B + record 32 B)": (records, 2, 3, zero, 0, 24 + 32),  # 4 lanes per item
        "verify ALL (plan 24 B + record 32 B + KV 128 B)": (records, 2, 3, kvrows, 8, 24 + 32 + 128),
    }
    for name, (rows, rv, pw, kv, kvv, per) in specs.items():
        call = lambda: kernel((GRID,), (BLOCK,), (idx, rows, np.int32(rv), plan, np.int32(pw), kv, np.int32(kvv),
                                                 np.int64(N), sink))
        us = time_us(call)
        gbps = N * per / us / 1e3
        rec = {"layout": layout, "case": name, "items": N, "us": round(us, 1), "gbps": round(gbps, 1),
               "copy_fraction": round(gbps / copy_gbps, 3)}
        print(rec, flush=True)
        out["cases"].append(rec)
json.dump(out, open(sys.argv[1], "w"), indent=1)
