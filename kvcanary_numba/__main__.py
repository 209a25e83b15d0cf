"""``python -m kvcanary_numba``: the ``kvcanary`` command line."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
