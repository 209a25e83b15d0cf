"""Decide a fuzz run from its case records: a defect fails it, unless the API documents the input.

The shared harness (``../shared/tools/fuzz_bad_inputs.py``) carries its own list of what is invalid:
SGLang's signatures, where every keyword is required and the batch index arrays are int64. This
library documents more as valid (docs/concepts/compatibility.md, the functions' signatures):

- a keyword left out that has a default in the public function's signature (the "off" and
  derivable arguments: ``check_verify_expected_token=False``, ``swa_window_size=0``, ...), whose
  result is the full call's (``tests/test_call_defaults.py``);
- int32 batch index arrays where SGLang's launcher accepts int32 and int64: a ``StepBatch``'s
  request and token arrays and the public write's ``input_ids``, ``positions`` and
  ``out_cache_loc``, whose results equal int64's (``tests/test_monitor_int32.py``,
  ``tests/test_write_int32.py``).

The harness reports those as WRONG ("accepted an input the API documents as invalid"). This gate
lists them apart, with the reason, and fails (exit status 1) on any other defect: an uncoded
exception (Python's own call-signature TypeErrors aside), a hang, a crash, a rejected call that
changed state, or a wrong result.

``python benchmarks/fuzz_gate.py RECORDS.json`` (the harness's ``--json`` output).
"""

from __future__ import annotations

import inspect
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: the package and benchmarks/ from this checkout
    sys.path.insert(0, str(ROOT))

from benchmarks.fuzz_summary import DEFECTS  # noqa: E402 - the outcomes that are defects

#: Public write arguments documented to take int32 (SGLang's launcher canonicalises them).
WRITE_INT32 = ("input_ids", "positions", "out_cache_loc")


def documented(record: dict) -> str | None:
    """Why the API documents ``record``'s input as valid, or None when it does not."""
    if record["outcome"] != "WRONG":
        return None
    import kvcanary_numba
    from kvcanary_numba.monitor.batch import INDEX_FIELDS

    target, mutation, arg = record["target"], record["mutation"], record.get("arg")
    if mutation == "kw:missing" and hasattr(kvcanary_numba, target):
        parameter = inspect.signature(getattr(kvcanary_numba, target)).parameters.get(arg)
        if parameter is not None and parameter.default is not inspect.Parameter.empty:
            return f"{target}({arg}=...) has a default: {parameter.default!r}"
    if mutation.endswith("dtype:int32"):
        if target == "CanaryMonitor" and arg in INDEX_FIELDS:
            return f"StepBatch.{arg} may be int32"
        if target == "launch_canary_write_kernel" and arg in WRITE_INT32:
            return f"launch_canary_write_kernel({arg}=...) may be int32"
    return None


def gate(records: list[dict]) -> tuple[list[tuple[dict, str]], list[dict]]:
    """(documented cases with their reason, defects)."""
    allowed, defects = [], []
    for r in records:
        if r["outcome"] not in DEFECTS or (r["outcome"] == "OTHER" and r.get("signature")):
            continue
        why = documented(r)
        if why is None:
            defects.append(r)
        else:
            allowed.append((r, why))
    return allowed, defects


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        records = json.load(f)
    allowed, defects = gate(records)
    for r, why in allowed:
        print(f"documented: case {r['index']} {r['target']} {r['mutation']} on {r.get('arg')}: {why}")
    for r in defects:
        print(
            f"DEFECT: case {r['index']} {r['outcome']} {r['target']} {r['mutation']} on {r.get('arg')}: {r['detail']}"
        )
    print(f"fuzz gate: {len(records)} cases, {len(allowed)} documented as valid by the API, {len(defects)} defects")
    return 1 if defects else 0


if __name__ == "__main__":
    sys.exit(main())
