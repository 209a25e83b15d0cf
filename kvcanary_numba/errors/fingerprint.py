"""Codes KVC-R…: real-KV sources and fingerprints (RealKvSource, launch-time source checks).

The real_kv_sources tuple as a whole (type, length, object tensors): :mod:`.sources`.
"""

from __future__ import annotations

from .registry import define

_LAYOUT = (
    "For slot s a source is read at row s // page_size, starting at column "
    "(s % page_size) * num_bytes_per_token of the row viewed as bytes."
)

define(
    "KVC-R001",
    title="RealKvSource.page_size below 1",
    message="{function}: page_size must be an int >= 1, got {got!r}",
    meaning=f"page_size is the number of KV slots stored in one row of the source. {_LAYOUT}",
    triggers=("page_size=0 from an unset configuration value.", "A float page size (16.0)."),
    solutions=("Pass the KV pool's page size as an int (1 for token-granular pools).",),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "k = np.zeros((64, 256), np.uint8)  # layer 0 of the K pool: 256 bytes per token\n"
        "kc.RealKvSource(tensor=k, page_size=0, num_bytes_per_token=256, read_bytes=256)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "k = np.zeros((64, 256), np.uint8)  # layer 0 of the K pool: 256 bytes per token\n"
        "kc.RealKvSource(tensor=k, page_size=1, num_bytes_per_token=256, read_bytes=256)"
    ),
    defensive="page_size = int(pool.page_size) or 1",
    prevention="Build sources with one helper that reads page size from the pool object.",
    related=("KVC-R002", "KVC-R006"),
    sglang=("kv-canary: RealKvSource.page_size must be >= 1, got {page_size}",),
)

define(
    "KVC-R002",
    title="num_bytes_per_token not a positive multiple of 16",
    message="{function}: num_bytes_per_token must be a positive multiple of 16, got {got!r}",
    meaning=(
        "The fingerprint reads 16-byte vectors (two little-endian u64 words), so each slot's strip "
        f"must start on a 16-byte boundary. {_LAYOUT}"
    ),
    triggers=("A KV head size whose bytes per token are not a multiple of 16 (e.g. 24).",),
    solutions=(
        "Fingerprint a 16-byte-aligned part of the token (round num_bytes_per_token down is not "
        "possible: it must be the real per-token stride); otherwise leave the source out.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "k = np.zeros((64, 24), np.uint8)  # 24 bytes per token\n"
        "kc.RealKvSource(tensor=k, page_size=1, num_bytes_per_token=24, read_bytes=16)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "k = np.zeros((64, 32), np.uint8)  # rows padded to 32 bytes\n"
        "kc.RealKvSource(tensor=k, page_size=1, num_bytes_per_token=32, read_bytes=16)"
    ),
    defensive="sources = (src,) if nbytes % 16 == 0 else ()",
    prevention="Check alignment once when the pool is created.",
    related=("KVC-R003",),
    sglang=("kv-canary: RealKvSource.num_bytes_per_token must be a positive multiple of 16, got {n}",),
)

define(
    "KVC-R003",
    title="read_bytes out of range",
    message=(
        "{function}: read_bytes must be a positive multiple of 16 in "
        "(0, num_bytes_per_token={num_bytes_per_token}], got {got!r}"
    ),
    meaning=(
        "read_bytes is how many leading bytes of each slot's strip ALL mode folds. It cannot be 0: "
        "there is no 'skip' sentinel, a source that should read nothing is simply left out."
    ),
    triggers=("read_bytes=0 to disable a source.", "read_bytes larger than the strip."),
    solutions=("Omit the source instead of read_bytes=0.", "Use read_bytes=num_bytes_per_token for the whole strip."),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "k = np.zeros((64, 128), np.uint8)\n"
        "kc.RealKvSource(tensor=k, page_size=1, num_bytes_per_token=128, read_bytes=0)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "k = np.zeros((64, 128), np.uint8)\n"
        "kc.RealKvSource(tensor=k, page_size=1, num_bytes_per_token=128, read_bytes=128)"
    ),
    defensive="read_bytes = min(num_bytes_per_token, max(16, read_bytes // 16 * 16))",
    prevention="Derive read_bytes from the mode: PARTIAL -> 16, ALL -> num_bytes_per_token.",
    related=("KVC-R002",),
    sglang=(
        "kv-canary: RealKvSource.read_bytes must be a positive multiple of 16 in (0, num_bytes_per_token={n}], got {r}",
        "kv-canary: read_bytes must be non-negative, got {n}",
        "kv-canary: read_bytes must be <= num_bytes_per_token ({n}), got {r}",
        "kv-canary: read_bytes must be a multiple of 16, got {r}",
    ),
)

define(
    "KVC-R004",
    title="Source tensor not 2-D",
    message="{function}: tensor must be 2-D [rows, row_elements], got shape {got}",
    meaning=(
        "A source is viewed as bytes [rows, row_bytes]; rows are pages (or tokens when page_size is "
        "1). A 1-D buffer has no rows, a 3-D one has an ambiguous row size."
    ),
    triggers=("Passing the whole [layers, slots, heads*dim] KV tensor.", "Passing a flat byte buffer."),
    solutions=("Pass one layer reshaped to 2-D: k_buffer[0].reshape(num_rows, -1).",),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "k_buffer = np.zeros((2, 64, 256), np.uint8)  # [layer, slot, bytes]\n"
        "kc.RealKvSource(tensor=k_buffer, page_size=1, num_bytes_per_token=256, read_bytes=256)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "k_buffer = np.zeros((2, 64, 256), np.uint8)  # [layer, slot, bytes]\n"
        "k = k_buffer[0]  # layer 0: [slot, bytes]\n"
        "kc.RealKvSource(tensor=k, page_size=1, num_bytes_per_token=256, read_bytes=256)"
    ),
    defensive="layer = k_buffer[0]; layer = layer.reshape(layer.shape[0], -1)",
    prevention="Fingerprint layer 0 (as SGLang does) through one helper.",
    related=("KVC-C003", "KVC-R005"),
    sglang=(
        "kv-canary: RealKvSource.tensor must be at least 2-D, got shape {shape}",
        "kv-canary: real_kv_sources[{i}].tensor (viewed as uint8) must be 2-D, got {d}-D",
    ),
)

define(
    "KVC-R005",
    title="Source rows not 16-byte strided",
    message=(
        "{function}: tensor rows must be contiguous and strided by a multiple of 16 bytes, "
        "got strides {got} (shape={shape}, dtype={dtype})"
    ),
    meaning=(
        "Rows may be a strided view of a larger buffer (e.g. one layer of a layer-interleaved pool), "
        "but each row must be contiguous and start on a 16-byte boundary for the vector loads."
    ),
    triggers=("A transposed view.", "A row stride of 24 bytes."),
    solutions=("Use a view whose rows are contiguous and 16-byte aligned, or pad the rows.",),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "k = np.zeros((256, 64), np.uint8).T  # [slot, bytes], rows 1 byte apart\n"
        "kc.RealKvSource(tensor=k, page_size=1, num_bytes_per_token=256, read_bytes=256)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "k = np.zeros((64, 256), np.uint8)  # rows 256 bytes apart\n"
        "kc.RealKvSource(tensor=k, page_size=1, num_bytes_per_token=256, read_bytes=256)"
    ),
    defensive="assert t.strides[-1] == t.itemsize and t.strides[0] % 16 == 0",
    prevention="Pad KV rows to a multiple of 16 bytes at allocation.",
    related=("KVC-C006", "KVC-C014"),
    sglang=(
        "kv-canary: RealKvSource.tensor row stride must be a multiple of 16 bytes, got {b} bytes "
        "(shape={shape}, strides={strides}, dtype={dtype})",
    ),
)

define(
    "KVC-R006",
    title="Source row narrower than its slots",
    message=(
        "{function}: tensor rows hold {got} bytes but page_size={page_size} x "
        "num_bytes_per_token={num_bytes_per_token} needs {needed}"
    ),
    meaning=(
        f"{_LAYOUT} A row must therefore hold page_size * num_bytes_per_token bytes; extra trailing "
        "bytes (holes) are allowed and never read."
    ),
    triggers=("page_size or num_bytes_per_token taken from another pool.", "A row view cut too short."),
    solutions=("Fix page_size / num_bytes_per_token to the tensor's real geometry.",),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "pages = np.zeros((16, 256), np.uint8)  # 256 bytes per page\n"
        "kc.RealKvSource(tensor=pages, page_size=4, num_bytes_per_token=128, read_bytes=16)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "pages = np.zeros((16, 256), np.uint8)  # 2 tokens of 128 bytes per page\n"
        "kc.RealKvSource(tensor=pages, page_size=2, num_bytes_per_token=128, read_bytes=16)"
    ),
    defensive="assert t.shape[1] * t.itemsize >= page_size * nbytes",
    prevention="Compute page_size and bytes per token from the same tensor.",
    related=("KVC-R001", "KVC-R002"),
    sglang=(
        "kv-canary: RealKvSource row is too narrow for its slot layout: dim-1 is {row_bytes} bytes "
        "but page_size={p} x num_bytes_per_token={n} needs {m}",
    ),
)

define(
    "KVC-R007",
    title="Sources do not cover every canary slot",
    message=(
        "{function}: real_kv_sources[{index}] has {rows} rows x page_size={page_size} = {got} slots, "
        "fewer than {slots_of} = {needed}"
    ),
    meaning=(
        f"{_LAYOUT} Verify and write fingerprint any in-range canary slot, so every source must hold "
        "bytes for slots 0 .. num_slots - 1: rows * page_size >= num_slots. The check is made once on "
        "the host so that the kernels never need a per-slot bounds check on the KV tensor, and a "
        "source that is too short can never make them read past its end. SGLang has no such check "
        "(its CUDA kernels would read out of bounds)."
    ),
    triggers=(
        "A source built from a slice of the KV pool (k_buffer[0][:n]) instead of the whole layer.",
        "page_size given in tokens while the tensor rows are single tokens (page_size too small).",
        "A canary buffer sized for a different, larger pool than the KV tensor.",
        "A paged pool whose last page is missing from the tensor view.",
    ),
    solutions=(
        "Pass the whole layer: the canary buffer and the KV pool have one slot per KV slot.",
        "Use page_size = slots per tensor row (1 for token-granular pools).",
        "Size the canary buffer from the KV pool: num_slots = rows * page_size.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "k = np.zeros((64, 256), np.uint8)  # layer 0 of the K pool: 256 bytes per token\n"
        "rows = k[:16]  # 16 of the pool's 64 rows\n"
        "src = kc.RealKvSource(tensor=rows, page_size=1, num_bytes_per_token=256, read_bytes=256)\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64, real_kv_sources=(src,),\n"
        "                                real_kv_hash_mode=kc.RealKvHashMode.ALL)\n"
        "plan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "kc.launch_canary_verify_kernel(context=ctx, plan=plan)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "k = np.zeros((64, 256), np.uint8)  # layer 0 of the K pool: 256 bytes per token\n"
        "src = kc.RealKvSource(tensor=k, page_size=1, num_bytes_per_token=256, read_bytes=256)\n"
        "ctx = kc.CanaryContext.allocate(num_slots=k.shape[0], real_kv_sources=(src,),\n"
        "                                real_kv_hash_mode=kc.RealKvHashMode.ALL)\n"
        "plan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "kc.launch_canary_verify_kernel(context=ctx, plan=plan)"
    ),
    defensive="assert all(s.slots_covered >= ctx.num_slots for s in ctx.real_kv_sources)",
    prevention=(
        "Derive num_slots and the sources from the same KV pool object in one helper, so they "
        "cannot disagree after a pool resize."
    ),
    related=("KVC-R001", "KVC-R006", "KVC-R008"),
    sglang=(),
    extension=True,
)
