"""Codes KVC-C… about buffers: row width, writability, alignment, allocation and sharing, for every operation."""

from __future__ import annotations

from .registry import define

define(
    "KVC-C012",
    title="Canary buffer rows too narrow",
    message=(
        "{function}: {argument} rows must be a multiple of 8 bytes and at least 32 bytes "
        "(4 int64 fields), got {got} bytes"
    ),
    meaning=(
        "A canary slot stores 4 little-endian int64 fields (token, position, prev_hash, "
        "real_kv_hash), so canary_buf is uint8 [num_slots, stride] with stride >= 32. Wider rows are "
        "allowed (the extra bytes are never touched); the stride must be a multiple of 8 so that every "
        "field is an aligned 8-byte word on the GPU (SGLang does not check this; it is an extension)."
    ),
    triggers=(
        "Allocating [num_slots, 16] or a 1-column buffer.",
        "A stride such as 36 or 40 + 4 that is not a multiple of 8.",
    ),
    solutions=("Allocate uint8 [num_slots, 32], or use CanaryContext.allocate.",),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "buf = np.zeros((64, 16), np.uint8)  # 16 bytes per slot\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64).replace(canary_buf=buf)\n"
        "plan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "kc.launch_canary_verify_kernel(context=ctx, plan=plan)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "buf = np.zeros((64, kc.CANARY_SLOT_BYTES), np.uint8)  # 32 bytes per slot\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64).replace(canary_buf=buf)\n"
        "plan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "kc.launch_canary_verify_kernel(context=ctx, plan=plan)"
    ),
    defensive="stride = max(32, requested_stride)",
    prevention="Use CanaryContext.allocate, which sizes the buffer.",
    related=("KVC-C002", "KVC-C003"),
    sglang=(
        "kv-canary: canary_buf slot stride must hold at least 4 int64 fields, got {n}",
        "canary_verify: slot_stride_bytes must hold at least 32 bytes per slot, got {n}",
        "canary_write: slot_stride_bytes must hold at least 32 bytes per slot, got {n}",
    ),
)

define(
    "KVC-C013",
    title="Read-only output array",
    message="{function}: {argument} is written by this call and must be writeable",
    meaning=(
        "Plans, canary buffers, rings and counters are written in place. A read-only NumPy array "
        "(np.load with mmap_mode='r', a broadcast view, flags.writeable = False) cannot be, nor a CUDA "
        "array whose __cuda_array_interface__ says data=(ptr, True) (JAX arrays): those are inputs only."
    ),
    triggers=(
        "Loading a saved canary buffer with mmap_mode='r' and verifying into it.",
        "Passing a JAX array as a plan output or as part of a CanaryContext.",
    ),
    solutions=("Pass a writeable copy (array.copy()).",),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "buf = np.zeros((64, 32), np.uint8)\n"
        'buf.flags.writeable = False  # as np.load(path, mmap_mode="r") gives it\n'
        "ctx = kc.CanaryContext.allocate(num_slots=64).replace(canary_buf=buf)\n"
        "plan = kc.WritePlan.allocate(write_req_capacity=1)\n"
        "pos = np.arange(4)\n"
        "kc.launch_canary_write_kernel(context=ctx, plan=plan, input_ids=100 + pos,\n"
        "                              positions=pos, out_cache_loc=10 + pos)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "buf = np.zeros((64, 32), np.uint8)  # writeable (np.load(path).copy())\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64).replace(canary_buf=buf)\n"
        "plan = kc.WritePlan.allocate(write_req_capacity=1)\n"
        "pos = np.arange(4)\n"
        "kc.launch_canary_write_kernel(context=ctx, plan=plan, input_ids=100 + pos,\n"
        "                              positions=pos, out_cache_loc=10 + pos)"
    ),
    defensive="if not a.flags.writeable: a = a.copy()",
    prevention="Only pass buffers you own as outputs.",
    related=("KVC-C006",),
    extension=True,
)

define(
    "KVC-C014",
    title="Misaligned device array",
    message="{function}: {argument} data must be aligned to {expected} bytes, got address {got:#x}",
    meaning=(
        "Kernels load canary fields as 8-byte words, real-KV bytes as 16-byte vectors and every "
        "other array element by element; an array starting at an unaligned address (a byte-offset "
        "view) would fault on the GPU."
    ),
    triggers=(
        "A uint8 view that starts at an odd byte offset of a larger allocation.",
        "An int64 / int32 CUDA array whose address is not a multiple of 8 / 4 bytes (a view built from a byte offset).",
    ),
    solutions=("Allocate the array fresh, or slice at multiples of the stated alignment.",),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "raw = np.zeros(32 * 65, np.uint8)\n"
        "buf = raw[3 : 3 + 32 * 64].reshape(64, 32)  # starts 3 bytes into raw\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64).replace(canary_buf=buf)\n"
        "plan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "kc.launch_canary_verify_kernel(context=ctx, plan=plan)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "raw = np.zeros(32 * 65, np.uint8)\n"
        "buf = raw[32:].reshape(64, 32)  # starts at a multiple of 8 bytes\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64).replace(canary_buf=buf)\n"
        "plan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "kc.launch_canary_verify_kernel(context=ctx, plan=plan)"
    ),
    defensive="assert arr.data.ptr % 16 == 0",
    prevention="Never carve canary-owned arrays out of byte pools at arbitrary offsets.",
    related=("KVC-R005",),
    extension=True,
)

define(
    "KVC-C015",
    title="Buffer cannot be allocated",
    message="{function}: {argument}={got} needs a {what} of {nbytes} bytes, which cannot be allocated ({reason})",
    meaning=(
        "Plans, canary buffers, rings and monitor scratch are allocated once, at their capacity. A "
        "capacity inside its documented range can still ask for more host or device memory than "
        "the process can get; the allocation is refused up front with the size it needed instead of "
        "a bare MemoryError from the array library. The CUDA path also keeps launch scratch of its own "
        "(a plan's look-back state, the chain a long write publishes), allocated by the first call of "
        "each size class on each stream; while that stream captures a CUDA graph nothing can be "
        "allocated, so such a first call is refused before the driver is asked, and the capture "
        "stays usable."
    ),
    triggers=(
        "A capacity derived from a product of engine limits that overflowed into a huge number.",
        "ring_capacity or verify_capacity sized for a much larger pool than the device holds.",
        "The first call of its sizes on a stream made while that stream captures a CUDA graph.",
    ),
    solutions=(
        "Size the capacity from the engine's real limits (slots, batch, tokens); see each "
        "argument's documented upper bound.",
        "Free device memory, or allocate on a device with room for the buffer.",
        "Run each captured call once on the capturing stream, with the same sizes, before the "
        "capture (a warm-up step, as CUDA-graph runners already do).",
    ),
    before=(
        "import kvcanary_numba as kc\n\nkc.CanaryContext.allocate(num_slots=2**31 - 1, slot_stride_bytes=4096)  # 8 TiB"
    ),
    after=(
        "import kvcanary_numba as kc\n\nkc.CanaryContext.allocate(num_slots=2**20)  # the KV pool's rows, 32 bytes each"
    ),
    defensive="capacity = min(capacity, 3 * num_slots)",
    prevention="Derive every capacity in one place from the pool size.",
    related=("KVC-C011",),
    extension=True,
)

define(
    "KVC-C017",
    title="Output shares memory with another argument",
    message="{function}: {argument} is written by this call and shares memory with {other}",
    meaning=(
        "An array a call writes (a plan, a canary buffer, the ring or a counter, pool_out, out) may share no "
        "byte with any other array argument of the same call. On a GPU, and under the simulator, the kernels' "
        "threads read inputs while others write outputs, so an aliased call is a data race whose result depends "
        "on scheduling; the call is refused on every backend, NumPy included, before anything is written or "
        "launched. Inputs may share memory with each other (both are only read), and views of one buffer that "
        "do not overlap are separate arrays (CanaryMonitor keeps its write index, counters and plan lanes as "
        "disjoint words of one status array). Memory is compared by byte ranges (pointer plus extent from shape "
        "and strides), as numpy.may_share_memory does."
    ),
    triggers=(
        "One scratch array passed as two outputs (slot_run_counter and kernel_run_counter, enable and "
        "verify_num_valid).",
        "An input reused as an output: write_seed_slot_indices over req_pool_indices, out over slot_indices, "
        "pool_out over flat_in.",
        "A canary buffer that is also a real-KV source of the write that stamps it.",
    ),
    solutions=(
        "Allocate each output on its own (CanaryContext.allocate, VerifyPlan.allocate, WritePlan.allocate), or "
        "carve outputs from one buffer as non-overlapping slices.",
        "Copy an input that must also be overwritten (out=slot_indices.copy()) and copy the result back after "
        "the call.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64)\n"
        "counter = np.zeros(1, np.int64)\n"
        "ctx = ctx.replace(slot_run_counter=counter, kernel_run_counter=counter)  # 1 array, 2x\n"
        "plan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "kc.launch_canary_verify_kernel(context=ctx, plan=plan)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64)\n"
        "counters = np.zeros(2, np.int64)  # one buffer, two disjoint views\n"
        "ctx = ctx.replace(slot_run_counter=counters[:1], kernel_run_counter=counters[1:])\n"
        "plan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "kc.launch_canary_verify_kernel(context=ctx, plan=plan)"
    ),
    defensive="assert not np.may_share_memory(out, slot_indices)  # cupy.may_share_memory on a GPU",
    prevention="Give every output its own allocation, made once at start-up and reused every step.",
    related=("KVC-C013", "KVC-C007"),
    extension=True,
)
