"""Codes KVC-R… about the real_kv_sources tuple as a whole: its type, its length and the contents of its tensors."""

from __future__ import annotations

from .registry import define

define(
    "KVC-R008",
    title="More than 4 real-KV sources",
    message="{function}: real_kv_sources holds at most {expected} sources, got {got}",
    meaning=(
        "The kernels take a fixed table of up to 4 sources (SGLang's ABI: MAX_REAL_KV_SOURCES = 4), so "
        "one launch folds at most 4 strips of KV bytes into a slot's real_kv_hash. The limit is "
        "checked for every backend, CPU included, so a configuration that runs on the CPU also runs "
        "on the GPU."
    ),
    triggers=(
        "Fingerprinting one source per layer of a deep model.",
        "Listing K and V of several layers in one context.",
    ),
    solutions=(
        "Fingerprint layer 0 only (as SGLang does): one K source for the K canary, one V source for the V canary.",
        "Split the strips over several contexts (e.g. the K and V canaries) with at most 4 each.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "layers = [np.zeros((64, 256), np.uint8) for _ in range(8)]  # layer 0 of 8 K buffers\n"
        "sources = tuple(kc.RealKvSource(tensor=layer, page_size=1, num_bytes_per_token=256,\n"
        "                                read_bytes=256) for layer in layers)\n"
        "kc.CanaryContext.allocate(num_slots=64, real_kv_sources=sources,  # 8 sources\n"
        "                         real_kv_hash_mode=kc.RealKvHashMode.ALL)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "layers = [np.zeros((64, 256), np.uint8) for _ in range(8)]  # layer 0 of 8 K buffers\n"
        "sources = tuple(kc.RealKvSource(tensor=layer, page_size=1, num_bytes_per_token=256,\n"
        "                                read_bytes=256) for layer in layers)\n"
        "kc.CanaryContext.allocate(num_slots=64, real_kv_sources=sources[:1],  # as SGLang\n"
        "                         real_kv_hash_mode=kc.RealKvHashMode.ALL)"
    ),
    defensive="sources = tuple(sources)[:MAX_REAL_KV_SOURCES]  # only if dropping the rest is acceptable",
    prevention="Keep the list of fingerprinted strips in one place and size it against MAX_REAL_KV_SOURCES.",
    related=("KVC-R007", "KVC-R009"),
    sglang=(
        "kv-canary: at most 4 RealKvSource entries supported by the CUDA ABI, got {n}",
        "canary_verify: num_sources must be in [0, 4], got {n}",
        "canary_write: num_sources must be in [0, 4], got {n}",
    ),
)

define(
    "KVC-R009",
    title="real_kv_sources is not a tuple of RealKvSource",
    message="{function}: {argument} must be a tuple of RealKvSource, got {got}",
    exception="type",
    meaning=(
        "real_kv_sources lists the strips of live KV folded into each slot's fingerprint. Each "
        "entry must be a RealKvSource, whose constructor has already checked the tensor geometry "
        "(KVC-R001 ... KVC-R006); a bare array carries no page_size or byte counts."
    ),
    triggers=(
        "Passing the KV tensor itself instead of RealKvSource(tensor=..., ...).",
        "Passing None instead of an empty tuple for 'no sources'.",
        "A dict or generator of sources.",
    ),
    solutions=(
        "Wrap each tensor: RealKvSource(tensor=t, page_size=p, num_bytes_per_token=n, read_bytes=r).",
        "Use () for no sources.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "k = np.zeros((64, 256), np.uint8)  # layer 0 of the K pool: 256 bytes per token\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64).replace(real_kv_sources=k)\n"
        "plan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "kc.launch_canary_verify_kernel(context=ctx, plan=plan)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "k = np.zeros((64, 256), np.uint8)  # layer 0 of the K pool: 256 bytes per token\n"
        "src = kc.RealKvSource(tensor=k, page_size=1, num_bytes_per_token=256, read_bytes=256)\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64).replace(real_kv_sources=(src,))\n"
        "plan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "kc.launch_canary_verify_kernel(context=ctx, plan=plan)"
    ),
    defensive="sources = tuple(sources or ())",
    prevention="Build contexts with CanaryContext.allocate(real_kv_sources=...).",
    related=("KVC-R008", "KVC-C001"),
    sglang=(),
    extension=True,
)

define(
    "KVC-R010",
    title="Source tensor holds Python objects",
    message="{function}: tensor must hold plain data whose bytes can be fingerprinted, got dtype {got}",
    meaning=(
        "A source is read as raw bytes. An object array stores pointers to Python objects, not KV "
        "values: its bytes change with the interpreter's memory layout and cannot be viewed as uint8."
    ),
    triggers=("np.array(list_of_tensors, dtype=object).", "A pandas column converted with .to_numpy()."),
    solutions=("Pass the KV memory itself (a numeric NumPy / CuPy array or a view of it).",),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "k = np.zeros((64, 4), dtype=object)  # Python objects, not bytes\n"
        "kc.RealKvSource(tensor=k, page_size=1, num_bytes_per_token=32, read_bytes=32)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "k = np.zeros((64, 32), np.uint8)\n"
        "kc.RealKvSource(tensor=k, page_size=1, num_bytes_per_token=32, read_bytes=32)"
    ),
    defensive="assert not tensor.dtype.hasobject",
    prevention="Fingerprint the engine's KV buffer, never a container of tensors.",
    related=("KVC-R004", "KVC-R005"),
    extension=True,
)
