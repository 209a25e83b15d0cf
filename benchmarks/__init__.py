"""Benchmark suite of kvcanary_numba (``python benchmarks/run.py``; see ``benchmarks/NOTES.md``)."""
