"""Codes KVC-E…: the toy paged KV engine and the ``kvcanary`` command line."""

from __future__ import annotations

from .registry import define

define(
    "KVC-E001",
    title="Unknown fault class",
    message="{function}: {argument} must name fault classes from {expected}, got {got!r}",
    meaning=(
        "The toy engine injects a fixed set of KV-cache bugs, each one a class of real serving bugs "
        "the canary is meant to catch: token_flip (wrong input token), position_flip (wrong "
        "position), slot_reuse (a page handed to two requests), stale_page (prefix cache pointing "
        "at freed pages), kv_byte_flip (KV bytes changed after they were written), "
        "cached_kv_flip (the same, in a cached page only a sweep sees) and req_to_token (a trampled "
        "request-to-slot table entry)."
    ),
    triggers=("A typo in --faults or ToyEngine(faults=...).", "Using SGLang's perturb mode names."),
    solutions=("Use the listed names, or 'all' on the command line.",),
    before="kvcanary demo --faults token,kv_flip",
    after="kvcanary demo --faults token_flip,kv_byte_flip",
    defensive="faults = [f for f in faults if f in FAULT_CLASSES]",
    prevention="Take fault names from kvcanary_numba.engine.FAULT_CLASSES.",
    related=("KVC-E002",),
    extension=True,
)

define(
    "KVC-E002",
    title="Toy engine KV pool too small",
    message=(
        "{function}: num_pages={got} cannot hold max_running={max_running} requests of up to "
        "{max_tokens} tokens plus {prefixes} cached prefixes; need at least {needed} pages"
    ),
    meaning=(
        "The toy engine never preempts: it admits a request only when every running request can "
        "still grow to its maximum length, and it keeps one cached page range per shared prefix. "
        "The pool (page 0 is reserved as the padding page) must hold that worst case."
    ),
    triggers=("Raising max_running or the prompt lengths without raising num_pages.",),
    solutions=("Raise num_pages to the stated minimum, or lower max_running / the lengths.",),
    before=("from kvcanary_numba.engine import EngineConfig\n\nEngineConfig(num_pages=8, max_running=8)"),
    after=("from kvcanary_numba.engine import EngineConfig\n\nEngineConfig(num_pages=96, max_running=8)"),
    defensive="num_pages = max(num_pages, EngineConfig.min_pages(...))",
    prevention="Size the toy pool from the workload parameters.",
    related=("KVC-E003",),
    extension=True,
)

define(
    "KVC-E003",
    title="Shared prefix length invalid",
    message=(
        "{function}: shared_prefix_len must be a multiple of page_size={page_size} and shorter than "
        "min_prompt_len={min_prompt_len}, got {got}"
    ),
    meaning=(
        "Requests share a cached system prompt of shared_prefix_len tokens. Prefix sharing maps "
        "whole pages (a page is owned by one chain), and every request must still prefill at least "
        "one token of its own, so the shared part is page-aligned and shorter than any prompt."
    ),
    triggers=("shared_prefix_len=3 with page_size=2.", "shared_prefix_len equal to the prompt length."),
    solutions=("Round shared_prefix_len down to a multiple of page_size below min_prompt_len.",),
    before=(
        "from kvcanary_numba.engine import EngineConfig\n"
        "\n"
        "EngineConfig(page_size=4, shared_prefix_len=6, min_prompt_len=6)"
    ),
    after=(
        "from kvcanary_numba.engine import EngineConfig\n"
        "\n"
        "EngineConfig(page_size=4, shared_prefix_len=4, min_prompt_len=6)  # whole pages"
    ),
    defensive="shared = (min_prompt_len - 1) // page_size * page_size",
    prevention="Derive the shared prefix length from the page size.",
    related=("KVC-E002",),
    extension=True,
)

define(
    "KVC-E004",
    title="Toy engine argument of the wrong type",
    message="{function}: {argument} must be {expected}, got {got}",
    exception="type",
    meaning=(
        "ToyEngine takes its geometry as one EngineConfig (validated once, reproducible from its "
        "repr) and its faults as fault-class names or a mapping of name to first step. Other types "
        "would be read field by field and fail half-way through building the engine."
    ),
    triggers=("ToyEngine({'seed': 1}) instead of ToyEngine(EngineConfig(seed=1)).", "faults=5 or faults=None."),
    solutions=("Wrap the settings: EngineConfig(**settings).", "Pass faults=() for none, or a list of names."),
    before=('from kvcanary_numba.engine import EngineConfig, ToyEngine\n\nToyEngine({"seed": 1}, faults=None)'),
    after=("from kvcanary_numba.engine import EngineConfig, ToyEngine\n\nToyEngine(EngineConfig(seed=1), faults=())"),
    defensive="cfg = cfg if isinstance(cfg, EngineConfig) else EngineConfig(**cfg)",
    prevention="Build the config once with EngineConfig and pass it around.",
    related=("KVC-E001",),
    extension=True,
)

define(
    "KVC-E005",
    title="Toy engine pool too large",
    message="{function}: the KV pool needs {got} bytes of KV and tables; the toy engine allows at most {limit}",
    meaning=(
        "The toy engine allocates every layer's K and V bytes (and the SWA pool's) up front. Its "
        "limit keeps a mistyped size from allocating for minutes or failing deep inside NumPy; a "
        "real engine's pool is its own business, the monitor only fingerprints layer 0."
    ),
    triggers=("num_layers or num_pages set to a production model's size.",),
    solutions=("Use a few layers and pages: the toy engine exercises the canary, not the model.",),
    before=(
        "from kvcanary_numba.engine import EngineConfig\n"
        "\n"
        "EngineConfig(num_layers=80, num_pages=2**20, bytes_per_token=1024)"
    ),
    after=(
        "from kvcanary_numba.engine import EngineConfig\n\nEngineConfig(num_layers=2, num_pages=64, bytes_per_token=32)"
    ),
    defensive="num_layers = min(num_layers, 4)",
    prevention="Keep toy-engine configurations small (the defaults).",
    related=("KVC-E002",),
    extension=True,
)
