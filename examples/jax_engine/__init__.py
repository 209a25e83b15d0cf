"""A Llama-shaped JAX serving engine over a paged KV pool, watched by kvcanary_numba's CanaryMonitor.

See README.md beside this file. ``python -m examples.jax_engine`` runs the demo.
"""

from .canary import JaxCanary
from .config import LLAMA_3_1_8B, LLAMA_3_2_1B, TINY, TINY_ENGINE, EngineConfig, ModelConfig
from .engine import JaxEngine
from .faults import FAULT_CLASSES, REAL_KV_FAULTS, FaultRecord

__all__ = [
    "FAULT_CLASSES",
    "LLAMA_3_1_8B",
    "LLAMA_3_2_1B",
    "REAL_KV_FAULTS",
    "TINY",
    "TINY_ENGINE",
    "EngineConfig",
    "FaultRecord",
    "JaxCanary",
    "JaxEngine",
    "ModelConfig",
]
