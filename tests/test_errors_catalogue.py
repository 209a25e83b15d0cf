"""The error catalogue agrees with the code: complete entries, every code raised by a test, every raise registered.

Static scans read the package and the other test files as text (or AST), so a
code that is defined but never exercised, or raised but never defined, fails here.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import re
import string
import subprocess
import sys

import pytest

from kvcanary_numba.errors import REGISTRY, KvCanaryError, KvCanaryTypeError, docs_url, error

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kvcanary_numba"
CODE_RE = re.compile(r"KVC-[A-Z]\d{3}")
CODES = sorted(REGISTRY)


def _sources(folder: pathlib.Path, pattern: str = "*.py") -> dict[pathlib.Path, str]:
    return {path: path.read_text(encoding="utf-8") for path in sorted(folder.rglob(pattern))}


def _package_modules(include_errors: bool = True) -> dict[pathlib.Path, str]:
    return {
        path: text
        for path, text in _sources(PACKAGE).items()
        if include_errors or "errors" not in path.relative_to(PACKAGE).parts
    }


def _dummy_fields(code: str) -> dict[str, int]:
    # Ints satisfy every format spec a template may use ({got!r}, {got:#x}, {expected}).
    return {name: 1 for name in REGISTRY[code].fields}


def test_registry_is_not_empty():
    assert len(CODES) >= 14 and all(CODE_RE.fullmatch(c) for c in CODES)


@pytest.mark.parametrize("code", CODES)
def test_entry_is_complete(code):
    entry = REGISTRY[code]
    for name in ("title", "message", "meaning", "before", "after", "defensive", "prevention"):
        value = getattr(entry, name)
        assert isinstance(value, str) and value.strip(), f"{code}: {name} is empty"
    for name in ("triggers", "solutions", "related"):
        values = getattr(entry, name)
        assert values and all(isinstance(v, str) and v.strip() for v in values), f"{code}: {name} is empty"
    assert entry.sglang or entry.extension, f"{code}: give SGLang's message(s) or mark extension=True"
    assert all(isinstance(m, str) and m.strip() for m in entry.sglang)
    assert entry.exception in ("value", "type")


@pytest.mark.parametrize("code", CODES)
def test_related_codes_exist(code):
    related = REGISTRY[code].related
    missing = [c for c in related if c not in REGISTRY]
    assert not missing, f"{code} relates to unregistered {missing}"
    assert code not in related


@pytest.mark.parametrize("code", CODES)
def test_message_template_parses_and_formats(code):
    entry = REGISTRY[code]
    parsed = list(string.Formatter().parse(entry.message))
    names = [name for _, name, _, _ in parsed if name is not None]
    assert all(name.isidentifier() for name in names), f"{code}: positional or odd field in {entry.message!r}"
    assert entry.message.startswith("{function}: "), f"{code}: messages read '<function>: <argument> ...'"
    exc = error(code, **_dummy_fields(code))
    text = str(exc)
    assert text.endswith(f"[{code}] Run 'kvcanary explain {code}' or see {docs_url(code)}")
    assert text.endswith(entry.ending) and entry.url == docs_url(code)
    assert exc.code == code and exc.entry is entry
    assert isinstance(exc, KvCanaryError) and isinstance(exc, ValueError)
    assert isinstance(exc, TypeError) == (entry.exception == "type")


# The examples (Before raises the code, After runs, as printed on the built page and by
# ``kvcanary explain``) are tested in test_docs_catalogue.py.


def test_example_error_names_argument_value_and_url():
    exc = error("KVC-P001", function="launch_plan_offsets_kernel", argument="out_write_offsets", got=0)
    text = str(exc)
    assert text.startswith("launch_plan_offsets_kernel: out_write_offsets length must be positive")
    assert text.endswith(
        "got 0 [KVC-P001] Run 'kvcanary explain KVC-P001' or see"
        " https://kvcanary-numba.readthedocs.io/en/latest/errors/KVC-P001/"
    )
    assert not isinstance(exc, KvCanaryTypeError)


def test_error_refuses_missing_fields():
    with pytest.raises(RuntimeError, match="did not supply"):
        error("KVC-P001", function="f")


def test_every_code_is_exercised_by_a_test():
    this = pathlib.Path(__file__).resolve()
    mentioned = set()
    for path, text in _sources(this.parent, "test_*.py").items():
        if path.resolve() != this:
            mentioned |= set(CODE_RE.findall(text))
    missing = [code for code in CODES if code not in mentioned]
    assert not missing, f"codes no test raises: {missing}"


def _error_calls():
    """(path, line, first argument node) of every ``error(...)`` call in the package outside errors/."""
    for path, text in _package_modules(include_errors=False).items():
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, ast.Call) and _is_error_function(node.func):
                yield path, node.lineno, node.args[0] if node.args else None


def _is_error_function(func: ast.expr) -> bool:
    """``error(...)`` or ``errors.error(...)``, not ``logger.error(...)``."""
    if isinstance(func, ast.Name):
        return func.id == "error"
    return isinstance(func, ast.Attribute) and func.attr == "error" and getattr(func.value, "id", None) == "errors"


def test_every_raise_site_uses_a_registered_literal_code():
    calls = list(_error_calls())
    assert calls, "no error(...) call found: the scan is broken"
    problems = []
    for path, line, arg in calls:
        where = f"{path.relative_to(ROOT)}:{line}"
        if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
            problems.append(f"{where}: code is not a string literal (cannot be checked statically)")
        elif arg.value not in REGISTRY:
            problems.append(f"{where}: {arg.value} is not registered")
    assert not problems, "\n".join(problems)


def test_every_code_mentioned_in_the_package_is_registered():
    unknown = sorted(
        f"{path.relative_to(ROOT)}: {code}"
        for path, text in _package_modules().items()
        for code in set(CODE_RE.findall(text))
        if code not in REGISTRY
    )
    assert not unknown, unknown


def test_no_bare_builtin_exceptions_outside_errors():
    pattern = re.compile(r"raise\s+(ValueError|TypeError|IndexError|KeyError)\s*\(")
    found = [
        f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
        for path, text in _package_modules(include_errors=False).items()
        for m in pattern.finditer(text)
    ]
    assert not found, "raise a registered code instead:\n" + "\n".join(found)


def test_no_assert_statements_in_the_package():
    # Validation must not vanish under python -O.
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path, text in _package_modules().items()
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Assert)
    ]
    assert not found, found


# SGLang's plan and scatter errors (SGLang's raises in its plan and scatter launchers) -> the code that covers each.
SGLANG_PLAN_SCATTER = {
    "kv-canary: launch_canary_plan_kernels requires full_to_swa_index_mapping when swa_window_size > 0": "KVC-P005",
    "kv-canary: launch_canary_plan_kernels supports at most bs=4096 reqs per launch, got bs={bs}. "
    "Bump _PLAN_BS_BLOCK_SIZE if real workloads need this.": "KVC-P003",
    "kv-canary: launch_canary_plan_kernels verify_capacity={c} does not match "
    "verify_plan_out.verify_slot_indices.shape[0]={p}": "KVC-P004",
    "kv-canary: launch_plan_entries_kernel requires req_to_verify_expected_tokens_valid_lens "
    "when req_to_verify_expected_tokens is set": "KVC-P006",
    "kv-canary: {name} must have dtype {dtype}, got {actual}": "KVC-C002",
    "kv-canary: {name} must be 1-D, got shape {shape}": "KVC-C003",
    "kv-canary: {name} must be 2-D, got shape {shape}": "KVC-C003",
    "kv-canary: {name} length must be {expected}, got {actual}": "KVC-C004",
    "kv-canary: {name} length must be >= {minimum}, got {actual}": "KVC-C005",
    "kv-canary: {name} must be on {reference_name}'s device {ref_device}, got {device}": "KVC-C007",
    "kv-canary: offsets kernel bs must be in [0, 4096], got {bs}": "KVC-P003",
    "kv-canary: write_offsets_len must be positive, got {n}": "KVC-P001",
    "kv-canary: write_req_capacity must be non-negative, got {n}": "KVC-C011",
    "kv-canary: verify_capacity must be non-negative, got {n}": "KVC-C011",
    "kv-canary: req_to_token_stride0 must be positive, got {n}": "KVC-C006",
    "kv-canary: lut_len must be non-negative, got {n}": "KVC-C011",
    "kv-canary: has_swa_lut must be bool, got {type}": "KVC-C010",
    "kv-canary: lut_len must be positive when has_swa_lut is True": "KVC-C005",
    "kv-canary: lut_len must be 0 when has_swa_lut is False": "KVC-P005",
    "kv-canary: write_offsets_len must equal write_req_capacity + 1, got {a} and {b}": "KVC-P002",
    "kv-canary: bs={bs} exceeds write_req_capacity={c}": "KVC-P003",
    "kv-canary: req_to_token_stride0={a} does not match req_to_token.stride(0)={b}": "KVC-C006",
    "kv-canary: launch_canary_plan_kernels_torch_reference verify_capacity={c} does not match "
    "verify_plan_out.verify_slot_indices.shape[0]={p}": "KVC-P004",
    "kv-canary: launch_canary_plan_kernels_torch_reference requires req_to_verify_expected_tokens_valid_lens "
    "when req_to_verify_expected_tokens is set": "KVC-P006",
    "kv-canary: scatter_req_token_ids flat_in must be 1-D, got shape {shape}": "KVC-C003",
    "kv-canary: scatter_req_token_ids offsets must be 1-D, got shape {shape}": "KVC-C003",
    "kv-canary: scatter_req_token_ids req_pool_indices must be 1-D, got shape {shape}": "KVC-C003",
    "kv-canary: scatter_req_token_ids pool_out must be 2-D, got shape {shape}": "KVC-C003",
    "kv-canary: scatter_req_token_ids offsets length {len} != bs+1 ({bs+1})": "KVC-S001",
    "kv-canary: scatter_req_token_ids flat_in must be int64, got {dtype}": "KVC-C002",
    "kv-canary: scatter_req_token_ids offsets must be int64, got {dtype}": "KVC-C002",
    "kv-canary: scatter_req_token_ids req_pool_indices must be int64, got {dtype}": "KVC-C002",
    "kv-canary: scatter_req_token_ids pool_out must be int32, got {dtype}": "KVC-C002",
}
# #43 ("kv-canary: SWA slot {slot} is outside full_to_swa_index_mapping length {n}") is no error here:
# the value lives in a device array, so the plan emits OUT_OF_RANGE_SLOT and verify/write report it.


@pytest.mark.parametrize(("message", "code"), sorted(SGLANG_PLAN_SCATTER.items()))
def test_sglang_plan_and_scatter_errors_map_to_codes(message, code):
    assert message in REGISTRY[code].sglang, f"{code} should list SGLang's {message!r}"
