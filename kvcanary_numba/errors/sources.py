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

define(
    "KVC-R011",
    title="Source changed after it was built",
    message=(
        "{function}: {argument} no longer passes the checks it was built under ({cause}): {reason}. "
        "Its tensor or a field changed in place; build a new RealKvSource (a monitor: rebind_sources)"
    ),
    meaning=(
        "A RealKvSource is a frozen description of memory that is not frozen: the array it names can be "
        "reshaped in place (NumPy or CuPy `t.shape = ...`, a dtype or strides set on it), a PyTorch "
        "tensor can be given other storage (`set_`, a growing `resize_`), a field can be overwritten "
        "with `object.__setattr__`. Every launch that folds a source checks it again as it is then, "
        "before any kernel reads it: a fingerprint launched on the changed geometry would read outside "
        "the memory, or other bytes than the slot's. A monitor checks its sources' tensors (the object, "
        "its pointer and layout, the fields) at every post_forward and sweep; one that still passes "
        "every check is followed (as if rebound), one that does not is refused with this code and "
        "nothing is launched."
    ),
    triggers=(
        "Reshaping the KV buffer a source names in place (`kv.shape = ...`) instead of making a view.",
        "A PyTorch KV tensor grown with `resize_` or re-pointed with `set_` after the source was built.",
        "Changing a source's page_size or byte counts with `object.__setattr__`.",
    ),
    solutions=(
        "Leave the source's tensor as it was built; give reshaped or reallocated memory a new RealKvSource.",
        "On a CanaryMonitor, call rebind_sources(k_sources=..., v_sources=...) with the new sources.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "kv = np.zeros((64, 256), np.uint8)  # layer 0 of the K pool: 256 bytes per token\n"
        "src = kc.RealKvSource(tensor=kv, page_size=1, num_bytes_per_token=256, read_bytes=256)\n"
        "kv.shape = (128, 128)  # the same memory, reshaped in place\n"
        "kc.compute_real_kv_hash(real_kv_sources=(src,), real_kv_hash_mode=kc.RealKvHashMode.ALL,\n"
        "                        slot_indices=np.arange(4), out=np.zeros(4, np.int64))"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "kv = np.zeros((64, 256), np.uint8)  # layer 0 of the K pool: 256 bytes per token\n"
        "src = kc.RealKvSource(tensor=kv, page_size=1, num_bytes_per_token=256, read_bytes=256)\n"
        "halves = kv.reshape(128, 128)  # a view: the source's array keeps its shape\n"
        "kc.compute_real_kv_hash(real_kv_sources=(src,), real_kv_hash_mode=kc.RealKvHashMode.ALL,\n"
        "                        slot_indices=np.arange(4), out=np.zeros(4, np.int64))"
    ),
    defensive="source = RealKvSource(tensor=kv, **geometry)  # again, after anything that moves kv",
    prevention="Treat a source's tensor as read-only metadata: reshape and reallocate views, not the array.",
    related=("KVC-R006", "KVC-R007", "KVC-M023"),
    extension=True,
)
