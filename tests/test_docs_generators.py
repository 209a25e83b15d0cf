"""The documentation generators of ``docs/hooks/`` (error pages, API index, benchmark pages), without a build."""

from __future__ import annotations

import html
import json
import pathlib
import sys

import pytest

from kvcanary_numba.errors import OPERATIONS, REGISTRY

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs" / "hooks"))

import docgen_api  # noqa: E402
import docgen_bench  # noqa: E402
import docgen_errors  # noqa: E402


def test_escape_keeps_code_spans_and_escapes_markup():
    assert docgen_errors.escape("a_b *c* [d] <e>") == r"a\_b \*c\* \[d\] \<e\>"
    assert docgen_errors.escape("run `x[0]_*` now") == "run `x[0]_*` now"
    assert docgen_errors.code_span("a`b") == "``a`b``"
    assert docgen_errors.code_span("`x") == "`` `x ``"


def test_entry_page_links_only_registered_related_codes():
    entry = REGISTRY["KVC-P001"]
    fake = type(entry)(
        **{**{f: getattr(entry, f) for f in entry.__dataclass_fields__}, "related": ("KVC-P002", "KVC-X999")}
    )
    text = docgen_errors.render_entry(fake, REGISTRY)
    assert "[KVC-P002](KVC-P002.md)" in text
    assert "`KVC-X999` (not in the catalogue)" in text and "(KVC-X999.md)" not in text


def test_entry_page_states_extension_and_sglang_counterpart():
    extension = next(e for e in REGISTRY.values() if e.extension and not e.sglang)
    assert "SGLang has no such check" in docgen_errors.render_entry(extension, REGISTRY)
    ported = REGISTRY["KVC-P001"]
    text = docgen_errors.render_entry(ported, REGISTRY)
    assert "Extension: **no**" in text and f"<code>{ported.sglang[0]}</code></h3>" in text


def test_link_codes_links_registered_codes_outside_links():
    html = '<p>KVC-P001, <a href="x">KVC-P002</a>, KVC-X999 <code>KVC-C011</code></p>'
    linked = docgen_errors.link_codes(html, "../../", REGISTRY)
    assert '<a href="../../errors/KVC-P001/">KVC-P001</a>' in linked
    assert '<a href="x">KVC-P002</a>' in linked and "errors/KVC-P002/" not in linked
    assert "errors/KVC-X999/" not in linked
    assert '<code><a href="../../errors/KVC-C011/">KVC-C011</a></code>' in linked


def test_plain_roles_render_sphinx_roles_as_code():
    html = ":class:<code>~kvcanary_numba.context.CanaryContext</code>, :func:<code>a.b</code>"
    assert docgen_api.plain_roles(html) == "<code>CanaryContext</code>, <code>a.b</code>"


def test_index_groups_follow_operations_order():
    groups = docgen_errors.group_by_operation(REGISTRY, OPERATIONS)
    assert list(groups) == [letter for letter in OPERATIONS if letter in groups]
    assert sum(len(v) for v in groups.values()) == len(REGISTRY)


def test_api_discovery_skips_private_and_launch_modules():
    found = docgen_api.discover(ROOT / "kvcanary_numba")
    names = [dotted for modules in found.values() for dotted, _ in modules]
    assert not any(part.startswith("_") for name in names for part in name.split("."))
    assert not any(name.startswith("kvcanary_numba.launch") for name in names)
    assert docgen_api.page_path("kvcanary_numba.kernels.verify") == "api/kernels/verify.md"


def _write(path: pathlib.Path, content) -> pathlib.Path:
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return path


def test_benchmarks_without_results_say_so(tmp_path):
    pages, images = docgen_bench.render(tmp_path / "missing", "img")
    assert list(pages) == ["benchmarks.md"] and "No results yet" in pages["benchmarks.md"] and images == {}


def test_benchmarks_order_runs_by_their_date(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install -e '.[docs]'): no plots")
    record = {"op": "verify", "variant": "ALL", "size": 1 << 20, "median_us": 40.0}
    _write(
        tmp_path / "h100-2026-12-05-60ed848.json", {"meta": {"date": "2026-12-05T21:44:20+00:00"}, "results": [record]}
    )
    _write(
        tmp_path / "h200-2026-12-05-425bead.json", {"meta": {"date": "2026-12-04T10:00:00+00:00"}, "results": [record]}
    )
    _write(tmp_path / "undated.json", {"results": [record]})
    summary = docgen_bench.render(tmp_path, "img")[0]["benchmarks.md"]
    assert "## Latest run: `h100-2026-12-05-60ed848`" in summary
    order = [summary.index(f"[`{stem}`]") for stem in ("undated", "h200-2026-12-05-425bead", "h100-2026-12-05-60ed848")]
    assert order == sorted(order)


def test_benchmarks_tolerate_partial_and_broken_json(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install -e '.[docs]'): no plots")
    records = [
        {"op": "verify", "variant": "ALL", "size": 1 << 20, "median_us": 40.0, "gbps": 2000},
        {"op": "verify", "variant": "ALL", "size": 1 << 22, "median_us": 150.0},
        {"op": "verify", "variant": "NONE", "entries": 1 << 22, "median_ms": 0.1},
        {"op": "plan", "bs": 4096},  # no time yet: listed, not plotted
        "not a record",
    ]
    _write(tmp_path / "a.json", {"meta": {"device": "H200"}, "results": records})
    _write(tmp_path / "b.json", '{"results": [{"op": "write", "size": 8')  # truncated file
    _write(tmp_path / "c.json", [{"kernel": "write", "tokens": 8, "time_us": 3.5}])
    pages, images = docgen_bench.render(tmp_path, "img")
    assert sorted(images) == ["img/a-verify.svg", "img/c-write.svg"]
    assert all(b"<svg" in data for data in images.values())
    assert sorted(pages) == ["benchmarks.md", "benchmarks/a.md", "benchmarks/b.md", "benchmarks/c.md"]
    assert (
        "could not be read" in pages["benchmarks/b.md"]
        and "1 result entries are not objects" in pages["benchmarks/a.md"]
    )
    assert "| H200 |" in pages["benchmarks/a.md"] and "4096" in pages["benchmarks/a.md"]  # meta, unplotted record
    assert "](../img/a-verify.svg)" in pages["benchmarks/a.md"]
    summary = pages["benchmarks.md"]
    assert "## Latest run: `c`" in summary and "](img/c-write.svg)" in summary and "img/a-verify.svg" not in summary
    for stem in "abc":
        assert f"[`{stem}`](benchmarks/{stem}.md)" in summary
    assert "|---|" not in summary  # the hand-written summary (intro) is the page's one table
    series = docgen_bench.series(records[:4])
    assert series["verify"]["NONE"] == [(float(1 << 22), 100.0)]
    assert "plan" not in series
    assert docgen_bench.size_key(records[:4], "plan") == "bs"
    assert docgen_bench.size_key(records[:4], "verify") == "size"  # size and entries disagree


def test_benchmark_plots_are_cached_by_what_they_draw(tmp_path, monkeypatch):
    drawn = []
    real = docgen_bench.plot_svg
    monkeypatch.setattr(docgen_bench, "plot_svg", lambda *a: drawn.append(a) or real(*a))
    lines = {"ALL": [(1.0, 2.0), (4.0, 5.0)]}
    first = docgen_bench.cached_plot("verify", lines, "entries", tmp_path)
    again = docgen_bench.cached_plot("verify", {"ALL": [(1.0, 2.0), (4.0, 5.0)]}, "entries", tmp_path)
    assert first == again and len(drawn) == 1 and len(list(tmp_path.glob("*.svg"))) == 1
    docgen_bench.cached_plot("verify", {"ALL": [(1.0, 2.0), (4.0, 6.0)]}, "entries", tmp_path)  # a new point
    assert len(drawn) == 2 and len(list(tmp_path.glob("*.svg"))) == 2


def test_committed_benchmarks_page_is_short():
    pages, images = docgen_bench.render(ROOT / "benchmarks" / "results", "img")
    summary = pages["benchmarks.md"]
    assert summary.count("![") <= 3, "the summary page shows a few plots; the rest are on the run pages"
    assert len(pages) == 1 + len(list((ROOT / "benchmarks" / "results").glob("*.json")))


def test_benchmark_plots_draw_a_repeated_timing_once():
    # A "64 B burst model" record re-reads the timing of its verify record: the same points.
    records = [
        {"op": "verify", "variant": "ALL", "entries": 1 << 22, "median_us": 295.0},
        {"op": "verify", "variant": "ALL random, 64 B burst model", "entries": 1 << 22, "median_us": 295.0},
        {"op": "verify", "variant": "NONE", "entries": 1 << 22, "median_us": 119.0},
    ]
    assert sorted(docgen_bench.series(records)["verify"]) == ["ALL", "NONE"]
