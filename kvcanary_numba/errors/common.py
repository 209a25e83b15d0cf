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
    before="launch_canary_plan_kernels(**plan_args(prefix_lens=[4]))",
    after="launch_canary_plan_kernels(**plan_args(prefix_lens=np.asarray([4], dtype=np.int64)))",
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
        "Every array has one fixed dtype, the one SGLang's kernels use: int64 for per-request "
        "metadata, plans, tokens, positions, slots and rings; int32 for req_to_token, "
        "the expected-token pool and the count/flag scalars; uint8 for canary buffers. The kernels "
        "are compiled for exactly these dtypes and never cast."
    ),
    triggers=(
        "req_to_token allocated as int64 (SGLang's ReqToTokenPool is int32).",
        "Position or token arrays produced as int32 by the engine.",
        "violation_write_index allocated as int64 (it is int32, like SGLang's).",
    ),
    solutions=(
        "Allocate with the documented dtype, or cast once outside the hot path (astype).",
        "Use VerifyPlan.allocate / WritePlan.allocate / CanaryContext.allocate, which pick the dtypes.",
    ),
    before="launch_canary_write_kernel(**write_args(positions=xp.arange(4, dtype=xp.int32)))",
    after=(
        "launch_canary_plan_kernels(**plan_args(prefix_lens=xp.asarray([0]), extend_seq_lens=xp.asarray([4])))\n"
        "launch_canary_write_kernel(**write_args(positions=xp.arange(4, dtype=xp.int64)))"
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
    before=("flat = xp.asarray([5, 6, 7, 8])\nscatter_req_token_ids(**scatter_args(flat_in=flat.reshape(1, -1)))"),
    after=("flat = xp.asarray([5, 6, 7, 8])\nscatter_req_token_ids(**scatter_args(flat_in=flat.reshape(-1)))"),
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
        "counters = xp.zeros(12, dtype=xp.int64)  # one per launch tag\n"
        "launch_canary_verify_kernel(**verify_args(context=ctx.replace(slot_run_counter=counters)))"
    ),
    after=(
        "counters = xp.zeros(12, dtype=xp.int64)  # one per launch tag\n"
        "tag = 0\n"
        "launch_canary_verify_kernel(**verify_args(context=ctx.replace(slot_run_counter=counters[tag:tag + 1])))"
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
        "lut = xp.zeros(0, dtype=xp.int64)\n"
        "launch_canary_plan_kernels(**plan_args(swa_window_size=4, full_to_swa_index_mapping=lut))"
    ),
    after=(
        "lut = xp.zeros(num_slots + 1, dtype=xp.int64)\n"
        "launch_canary_plan_kernels(**plan_args(swa_window_size=4, full_to_swa_index_mapping=lut))"
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
        "batch_tokens = xp.zeros((4, 2), dtype=xp.int64)  # token, position columns\n"
        "launch_canary_write_kernel(**write_args(input_ids=batch_tokens[:, 0]))"
    ),
    after=(
        "batch_tokens = xp.zeros((4, 2), dtype=xp.int64)  # token, position columns\n"
        "launch_canary_plan_kernels(**plan_args(prefix_lens=xp.asarray([0]), extend_seq_lens=xp.asarray([4])))\n"
        "launch_canary_write_kernel(**write_args(input_ids=xp.ascontiguousarray(batch_tokens[:, 0])))"
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
