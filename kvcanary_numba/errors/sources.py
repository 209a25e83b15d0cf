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
        "layers = [xp.zeros((num_slots, 256), dtype=xp.uint8) for _ in range(32)]\n"
        "def source(layer):\n"
        "    return RealKvSource(tensor=layers[layer], page_size=1, num_bytes_per_token=256, read_bytes=256)\n"
        "ctx = ctx.replace(real_kv_sources=tuple(source(layer) for layer in range(32)),\n"
        "                  real_kv_hash_mode=RealKvHashMode.ALL)\n"
        "launch_canary_verify_kernel(**verify_args(context=ctx))"
    ),
    after=(
        "layers = [xp.zeros((num_slots, 256), dtype=xp.uint8) for _ in range(32)]\n"
        "def source(layer):\n"
        "    return RealKvSource(tensor=layers[layer], page_size=1, num_bytes_per_token=256, read_bytes=256)\n"
        "ctx = ctx.replace(real_kv_sources=(source(0),), real_kv_hash_mode=RealKvHashMode.ALL)\n"
        "launch_canary_verify_kernel(**verify_args(context=ctx))"
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
    before="launch_canary_verify_kernel(**verify_args(context=ctx.replace(real_kv_sources=k_layer0)))",
    after=(
        "sources = (RealKvSource(tensor=k_layer0, page_size=1, num_bytes_per_token=256, read_bytes=256),)\n"
        "launch_canary_verify_kernel(**verify_args(context=ctx.replace(real_kv_sources=sources)))"
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
    before="RealKvSource(tensor=np.zeros((64, 4), dtype=object), page_size=1, num_bytes_per_token=32, read_bytes=32)",
    after="RealKvSource(tensor=np.zeros((64, 32), dtype=np.uint8), page_size=1, num_bytes_per_token=32, read_bytes=32)",
    defensive="assert not tensor.dtype.hasobject",
    prevention="Fingerprint the engine's KV buffer, never a container of tensors.",
    related=("KVC-R004", "KVC-R005"),
    extension=True,
)
