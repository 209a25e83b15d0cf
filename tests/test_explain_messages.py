"""``kvcanary explain`` on a pasted message: ours (with or without its ending), SGLang's, values included.

Every message template of the catalogue, ours and SGLang's, filled with values, must lead back to
its entry; text that matches no template gets the three nearest entries, each with its reason.
"""

from __future__ import annotations

import re

import pytest

from kvcanary_numba import cli
from kvcanary_numba.errors import REGISTRY, error
from kvcanary_numba.errors.matching import match_message, pattern_source, template_pattern, words

CODES = sorted(REGISTRY)
SGLANG = sorted((code, message) for code, entry in REGISTRY.items() for message in entry.sglang)


def filled(template: str, value: str = "7") -> str:
    """``template`` with every ``{field}`` replaced by ``value``."""
    return re.sub(r"\{[^{}]*\}", value, template)


@pytest.mark.parametrize("code", CODES)
def test_our_whole_message_names_its_code(code):
    text = str(error(code, **{name: 0 for name in REGISTRY[code].fields}))
    assert [(m.code, m.how) for m in match_message(text)] == [(code, "code")]


@pytest.mark.parametrize("code", CODES)
def test_our_message_without_its_ending_matches_its_template(code):
    text = str(error(code, **{name: 7 for name in REGISTRY[code].fields}))
    body = text[: text.index(" [KVC-")]
    found = match_message("ERROR engine.step: " + body)  # a log prefix may come first
    assert code in [m.code for m in found] and all(m.how == "template" for m in found), found


@pytest.mark.parametrize(("code", "message"), SGLANG)
def test_sglangs_message_with_values_finds_its_entry(code, message):
    found = match_message(filled(message, "5000"))
    assert code in [m.code for m in found] and found[0].how == "template", (message, found)


def test_a_field_matches_any_value_and_white_space_may_wrap():
    pattern = template_pattern("kv-canary: scatter_req_token_ids offsets length {len} != bs+1 ({bs+1})")
    assert pattern.search("kv-canary: scatter_req_token_ids offsets\n   length 4 != bs+1 (5)").groups() == ("4", "5")
    assert pattern.search("kv-canary: scatter_req_token_ids offsets length 4 != bs 1 (5)") is None
    assert pattern_source("a.b {x} (c)") == r"a\.b\s+(.*?)\s+\(c\)"


def test_words_split_identifiers_and_drop_the_common_ones():
    assert words("kv-canary: write_offsets_len must be positive, got {n}") == {
        "write_offsets_len",
        "write",
        "offsets",
        "len",
        "positive",
    }


# --- the command ---------------------------------------------------------------------------------


def test_explain_a_pasted_sglang_message(capsys):
    assert cli.main(["explain", "kv-canary: write_offsets_len must be positive, got 0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kvcanary explain: KVC-P001, which matches 'kv-canary: write_offsets_len must be")
    assert "(values: 0)" in out and "KVC-P001  write_offsets is empty\n" in out


def test_explain_our_message_pasted_whole_or_without_quotes(capsys):
    text = str(error("KVC-P001", function="launch_canary_plan_kernels", argument="write_plan_out.write_offsets", got=0))
    assert cli.main(["explain", text]) == 0
    assert capsys.readouterr().out.startswith("kvcanary explain: KVC-P001, which the text names KVC-P001")
    body = text[: text.index(" [KVC-")]
    assert cli.main(["explain", *body.split()]) == 0  # pasted without quotes: the shell splits it
    out = capsys.readouterr().out
    assert out.startswith("kvcanary explain: KVC-P001, which matches '{function}: {argument} length must be")


def test_explain_a_message_of_several_entries_lists_them(capsys):
    assert cli.main(["explain", "kv-canary: bs=9 exceeds write_req_capacity=8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kvcanary explain: the message is listed under")
    assert "KVC-P003" in out and "(values: 9, 8)" in out


def test_explain_unmatched_text_gives_the_three_nearest_with_why(capsys):
    assert cli.main(["explain", "the write offsets are too short"]) == 2
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "kvcanary explain: no entry's message matches the text; the three nearest:"
    listed = [line.split()[0] for line in lines[1:] if line.startswith("  KVC-")]
    assert len(listed) == 3 and "KVC-P001" in listed
    assert out.count("why: shares ") == 3 and "nearest message:" in out
