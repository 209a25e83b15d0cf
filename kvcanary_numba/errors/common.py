"""Codes KVC-C… about arrays (type, dtype, shape, layout, writability), shared by every operation.

Devices, backend choice and host scalar arguments are in :mod:`.arguments`; row width,
writability, alignment and allocation of buffers in :mod:`.buffers`.
"""

from __future__ import annotations

from .registry import define

_ALL_OPS = "every launch function, the plan/context allocators and the monitor"

define(
    "KVC-C001",
    title="Unsupported array type",
    message=(
        "{function}: {argument} must be a NumPy array or an object with "
        "__cuda_array_interface__ (CuPy, Numba device array), got {got}"
    ),
    exception="type",
    meaning=(
        "kvcanary_numba only reads NumPy arrays (CPU path), CUDA arrays that expose "
        "__cuda_array_interface__ (CuPy, Numba, PyTorch, JAX: GPU path) and DLPack-only objects "
        "(viewed zero-copy). Lists and scalars are not converted implicitly, because a hidden copy "
        "would make the canary check a snapshot instead of the live buffer. An interface whose "
        "pointer the CUDA driver does not map (host memory posing as a CUDA array) is refused too: "
        "a kernel reading it would fault; so is one with a field missing or mistyped, a mask, an "
        "unknown version, a shape other than the object's, or more bytes than the allocation at its "
        "pointer. Masked arrays (the mask would be ignored), matrices and arrays of dates, text or "
        "records are not data the canary reads."
    ),
    triggers=(
        "Passing a Python list or tuple where an array is expected.",
        "A CPU framework tensor without DLPack, or a hand-made __cuda_array_interface__ over host memory.",
        "A PyTorch tensor with requires_grad=True: it refuses both exports (pass tensor.detach()).",
        "A numpy.ma masked array, or a producer whose __dlpack__ / __dlpack_device__ raises or lies.",
        f"Any argument of {_ALL_OPS}.",
    ),
    solutions=(
        "Wrap host data with numpy.asarray(..., dtype=...).",
        "Convert device tensors zero-copy with cupy.from_dlpack(tensor).",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan.allocate(write_req_capacity=1)\n"
        "kc.launch_canary_plan_kernels(\n"
        "    verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=np.array([1]),\n"
        "    prefix_lens=[4], extend_seq_lens=np.array([1]),\n"
        "    req_to_token=np.zeros((2, 8), np.int32))  # prefix_lens: a list"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan.allocate(write_req_capacity=1)\n"
        "kc.launch_canary_plan_kernels(\n"
        "    verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=np.array([1]),\n"
        "    prefix_lens=np.array([4]), extend_seq_lens=np.array([1]),\n"
        "    req_to_token=np.zeros((2, 8), np.int32))  # prefix_lens: an array"
    ),
    defensive="prefix_lens = cupy.from_dlpack(torch_prefix_lens)  # zero-copy view, live data",
    prevention="Keep the engine's metadata in CuPy (GPU) or NumPy (CPU) arrays from the start.",
    related=("KVC-C002", "KVC-C007"),
    sglang=(),
    extension=True,
)

define(
    "KVC-C002",
    title="Wrong dtype",
    message="{function}: {argument} must have dtype {expected}, got {got}",
    exception="type",
    meaning=(
        "Every array has the dtype SGLang's kernels use: int64 for per-request metadata, plans, "
        "tokens, positions, slots and rings; int32 for req_to_token, the expected-token pool and the "
        "count/flag scalars; uint8 for canary buffers. Where SGLang accepts int32 as well, so does "
        "this package: the write's input_ids, positions and out_cache_loc and a StepBatch's request "
        "and token arrays may be int32 or int64 (widened to int64 before a kernel reads them). Any "
        "other dtype is refused: the kernels are compiled for these dtypes and nothing is cast "
        "silently."
    ),
    triggers=(
        "req_to_token allocated as int64 (SGLang's ReqToTokenPool is int32).",
        "Positions or token ids computed in floating point (np.linspace, a division) or as uint32.",
        "violation_write_index allocated as int64 (it is int32, like SGLang's).",
    ),
    solutions=(
        "Allocate with the documented dtype, or cast once outside the hot path (astype).",
        "Use VerifyPlan.allocate / WritePlan.allocate / CanaryContext.allocate, which pick the dtypes.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64)\n"
        "plan = kc.WritePlan.allocate(write_req_capacity=1)  # filled by the plan step\n"
        "positions = np.linspace(0, 3, 4)  # float64\n"
        "kc.launch_canary_write_kernel(context=ctx, plan=plan, input_ids=100 + positions,\n"
        "                              positions=positions, out_cache_loc=np.arange(10, 14))"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64)\n"
        "plan = kc.WritePlan.allocate(write_req_capacity=1)  # filled by the plan step\n"
        "positions = np.arange(4)  # int64 (int32, as SGLang's launcher takes it, works too)\n"
        "kc.launch_canary_write_kernel(context=ctx, plan=plan, input_ids=100 + positions,\n"
        "                              positions=positions, out_cache_loc=np.arange(10, 14))"
    ),
    defensive="positions = positions.astype(np.int64, copy=False)  # no copy when already int64",
    prevention="Let the allocators build every canary-owned array; cast engine arrays once per step.",
    related=("KVC-C003", "KVC-C004"),
    sglang=(
        "kv-canary: {name} must have dtype {dtype}, got {actual}",
        "kv-canary: scatter_req_token_ids flat_in must be int64, got {dtype}",
        "kv-canary: scatter_req_token_ids offsets must be int64, got {dtype}",
        "kv-canary: scatter_req_token_ids req_pool_indices must be int64, got {dtype}",
        "kv-canary: scatter_req_token_ids pool_out must be int32, got {dtype}",
    ),
)

define(
    "KVC-C003",
    title="Wrong number of dimensions",
    message="{function}: {argument} must be {expected}-D, got shape {got}",
    meaning=(
        "Per-request metadata, plans and token arrays are 1-D; req_to_token, the expected-token pool, "
        "canary buffers, the violation ring and real-KV sources are 2-D."
    ),
    triggers=(
        "Passing a [bs, 1] column instead of a [bs] vector.",
        "Passing a flat 1-D KV buffer as a real-KV source.",
        "Passing a 3-D [layers, slots, bytes] KV tensor instead of one layer.",
    ),
    solutions=(
        "Flatten vectors with .reshape(-1) (a view when contiguous).",
        "View a KV layer as [rows, bytes]: layer.view(numpy.uint8).reshape(rows, -1).",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "pool = np.zeros((2, 8), np.int32)  # expected tokens per request row\n"
        "flat = np.array([[5, 6, 7, 8]])  # shape (1, 4)\n"
        "kc.scatter_req_token_ids(flat_in=flat, offsets=np.array([0, 4]),\n"
        "                         req_pool_indices=np.array([1]), pool_out=pool)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "pool = np.zeros((2, 8), np.int32)  # expected tokens per request row\n"
        "flat = np.array([5, 6, 7, 8])  # shape (4,)\n"
        "kc.scatter_req_token_ids(flat_in=flat, offsets=np.array([0, 4]),\n"
        "                         req_pool_indices=np.array([1]), pool_out=pool)"
    ),
    defensive="assert_1d = flat.reshape(-1)  # explicit flatten at the engine boundary",
    prevention="Keep a table of the documented shapes next to the engine's buffer definitions.",
    related=("KVC-C004",),
    sglang=(
        "kv-canary: {name} must be 1-D, got shape {shape}",
        "kv-canary: {name} must be 2-D, got shape {shape}",
        "kv-canary: scatter_req_token_ids flat_in must be 1-D, got shape {shape}",
        "kv-canary: scatter_req_token_ids offsets must be 1-D, got shape {shape}",
        "kv-canary: scatter_req_token_ids req_pool_indices must be 1-D, got shape {shape}",
        "kv-canary: scatter_req_token_ids pool_out must be 2-D, got shape {shape}",
    ),
)

define(
    "KVC-C004",
    title="Wrong length or shape",
    message="{function}: {argument} must have shape {expected}, got {got}",
    meaning=(
        "Arrays that describe the same batch must agree in length: prefix_lens, extend_seq_lens and "
        "req_pool_indices all have bs entries; scalar slots (num_valid, enable, counters, the write "
        "index) have exactly one; the violation ring has 8 columns."
    ),
    triggers=(
        "Slicing one metadata array to the live batch but not the others.",
        "A counter allocated with the number of launch tags instead of a 1-element view.",
        "A violation ring with the wrong number of columns.",
    ),
    solutions=(
        "Slice every per-request array with the same [:bs].",
        "Pass 1-element views (counters[tag:tag + 1]) for per-launch counters.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "counters = np.zeros(12, np.int64)  # one per launch tag\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64).replace(slot_run_counter=counters)\n"
        "plan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "kc.launch_canary_verify_kernel(context=ctx, plan=plan)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "counters = np.zeros(12, np.int64)  # one per launch tag\n"
        "tag = kc.CanaryLaunchTag.HEAD_K_FULL\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64)\n"
        "ctx = ctx.replace(slot_run_counter=counters[tag : tag + 1])  # this launch's [1] view\n"
        "plan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "kc.launch_canary_verify_kernel(context=ctx, plan=plan)"
    ),
    defensive="bs = len(req_pool_indices); prefix_lens, extend_seq_lens = prefix_lens[:bs], extend_seq_lens[:bs]",
    prevention="Derive every batch length from one variable.",
    related=("KVC-C003", "KVC-C005"),
    sglang=(
        "kv-canary: {name} length must be {expected}, got {actual}",
        "kv-canary: scatter_req_token_ids offsets length {len} != bs+1 ({bs+1})",
    ),
)

define(
    "KVC-C005",
    title="Array too short",
    message="{function}: {argument} length must be >= {expected}, got {got}",
    meaning="The operation reads or writes at least the stated number of elements of this array.",
    triggers=(
        "Token arrays (input_ids, positions, out_cache_loc) shorter than the expected inputs.",
        "An SWA LUT shorter than one entry.",
    ),
    solutions=("Allocate the array with at least the stated length (padding is allowed).",),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan.allocate(write_req_capacity=1)\n"
        "lut = np.zeros(0, np.int64)  # the full-to-SWA slot mapping, empty\n"
        "kc.launch_canary_plan_kernels(\n"
        "    verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=np.array([1]),\n"
        "    prefix_lens=np.array([4]), extend_seq_lens=np.array([1]),\n"
        "    req_to_token=np.zeros((2, 8), np.int32),\n"
        "    swa_window_size=4, full_to_swa_index_mapping=lut)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan.allocate(write_req_capacity=1)\n"
        "lut = np.arange(65, dtype=np.int64)  # full pool size + 1 entries\n"
        "kc.launch_canary_plan_kernels(\n"
        "    verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=np.array([1]),\n"
        "    prefix_lens=np.array([4]), extend_seq_lens=np.array([1]),\n"
        "    req_to_token=np.zeros((2, 8), np.int32),\n"
        "    swa_window_size=4, full_to_swa_index_mapping=lut)"
    ),
    defensive="assert lut.shape[0] >= full_pool_size + 1",
    prevention="Size buffers from the pool's capacity, not from the current batch.",
    related=("KVC-C004",),
    sglang=(
        "kv-canary: {name} length must be >= {minimum}, got {actual}",
        "kv-canary: lut_len must be positive when has_swa_lut is True",
    ),
)

define(
    "KVC-C006",
    title="Array not contiguous",
    message="{function}: {argument} must be C-contiguous, got strides {got} for shape {shape}",
    meaning=(
        "Kernels address arrays by flat index (and canary buffers by row * stride), so every array "
        "must be C-contiguous; a strided view would make them read the wrong elements. Real-KV "
        "sources are the exception: their rows may be strided (see KVC-R005)."
    ),
    triggers=(
        "Passing a column slice such as table[:, 0].",
        "Passing a transposed array.",
        "Passing every other element (a[::2]).",
    ),
    solutions=("Pass a contiguous copy made once (numpy.ascontiguousarray / cupy.ascontiguousarray).",),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64)\n"
        "plan = kc.WritePlan.allocate(write_req_capacity=1)  # filled by the plan step\n"
        "batch = np.array([[101, 0], [102, 1], [103, 2]])  # token, position columns\n"
        "tokens, positions = batch[:, 0], batch[:, 1]  # strided views\n"
        "kc.launch_canary_write_kernel(context=ctx, plan=plan, input_ids=tokens,\n"
        "                              positions=positions, out_cache_loc=np.arange(10, 13))"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64)\n"
        "plan = kc.WritePlan.allocate(write_req_capacity=1)  # filled by the plan step\n"
        "batch = np.array([[101, 0], [102, 1], [103, 2]])  # token, position columns\n"
        "tokens, positions = np.ascontiguousarray(batch.T)  # two contiguous rows\n"
        "kc.launch_canary_write_kernel(context=ctx, plan=plan, input_ids=tokens,\n"
        "                              positions=positions, out_cache_loc=np.arange(10, 13))"
    ),
    defensive="x = x if x.flags.c_contiguous else xp.ascontiguousarray(x)",
    prevention="Keep persistent canary buffers as fresh allocations, never views.",
    related=("KVC-R005",),
    sglang=(
        "kv-canary: {name} must be contiguous",
        "kv-canary: req_to_token_stride0 must be positive, got {n}",
        "kv-canary: req_to_token_stride0={a} does not match req_to_token.stride(0)={b}",
    ),
)
