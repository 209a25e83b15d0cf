"""Which catalogue entry a pasted error message belongs to: ours, or SGLang's, values included.

``kvcanary explain`` takes a whole pasted line (``kv-canary: write_offsets_len must be
positive, got 0``, or one of ours with its ``[KVC-P001]`` ending) and :func:`match_message`
finds its entry:

1. a registered code written in the text (every message of ours ends with it) decides;
2. else each entry's message template and SGLang messages are read as patterns, the fields in
   braces standing for any value (:func:`template_pattern`); the patterns that match the end of
   the text win, the one with the most literal text first (the most specific);
3. else the entries are ranked by the words they share with the text (and how alike the
   nearest message reads), and the best three are returned with the words that tied them.

The catalogue index page's filter box runs the same patterns (``docs/hooks/docgen_errors.py``
writes them into the page), so a pasted message finds its row there too.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .registry import REGISTRY, ErrorEntry

__all__ = [
    "COMMON_WORDS",
    "Match",
    "literal_length",
    "match_message",
    "pattern_source",
    "template_pattern",
    "templates",
    "words",
]

_CODE = re.compile(r"\bKVC-[A-Z]\d{3}\b", re.IGNORECASE)
_FIELD = re.compile(r"\{[^{}]*\}")
_META = re.compile(r"([.^$*+?()\[\]{}|\\/])")
_WORD = re.compile(r"[a-z_][a-z0-9_+]*[a-z0-9_]|[a-z]")
#: Words every message has (SGLang's prefix, the grammar of "<argument> must ..., got <value>").
COMMON_WORDS = frozenset(
    "kv canary kv_canary kvcanary must be is are got the a an of to for in on or and not with when "
    "than its it this that run explain see https kvcanary_numba readthedocs io en latest errors".split()
)


@dataclass(frozen=True)
class Match:
    """One entry found for a pasted message.

    Attributes
    ----------
    code : str
        The entry's code.
    how : {"code", "template", "words"}
        A code in the text, a message pattern that matched, or shared words only.
    template : str
        The message (ours or SGLang's) that matched or reads nearest; empty for ``"code"``.
    values : tuple of str
        What the template's fields stood for in the text (``"template"`` only).
    shared : tuple of str
        The words the text shares with the entry (``"words"`` only).
    score : float
        The literal characters matched (``"template"``) or the similarity in ``[0, 1]``.
    """

    code: str
    how: str
    template: str = ""
    values: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()
    score: float = 0.0

    def why(self) -> str:
        """One line saying why this entry was chosen."""
        if self.how == "code":
            return f"the text names {self.code}"
        if self.how == "template":
            values = ", ".join(self.values)
            return f"matches {self.template!r}" + (f" (values: {values})" if values else "")
        shared = ", ".join(self.shared) or "no words"
        return f"shares {shared}; nearest message: {self.template!r}"


def templates(entry: ErrorEntry) -> tuple[str, ...]:
    """The messages of ``entry`` a pasted line may be: its own template, then SGLang's."""
    return (entry.message, *entry.sglang)


def pattern_source(template: str) -> str:
    """A regular expression (the same in Python and JavaScript) for ``template``: literal text as
    it is (any run of white space as any white space), each ``{field}`` as any value."""
    literals = [re.sub(r"\s+", r"\\s+", _META.sub(r"\\\1", part)) for part in _FIELD.split(template)]
    return "(.*?)".join(literals)


def literal_length(template: str) -> int:
    """Characters of ``template`` outside its fields: how specific a match of it is."""
    return len(_FIELD.sub("", template))


def template_pattern(template: str) -> re.Pattern:
    """:func:`pattern_source` compiled to match a pasted text's end (a log prefix may come first)."""
    return re.compile(pattern_source(template) + r"\s*$", re.DOTALL)


_PATTERNS: dict[str, re.Pattern] = {}


def _pattern(template: str) -> re.Pattern:
    hit = _PATTERNS.get(template)
    if hit is None:
        hit = _PATTERNS[template] = template_pattern(template)
    return hit


def words(text: str) -> set[str]:
    """The distinctive lower-case words of ``text`` (identifiers and words, minus the common ones)."""
    found = set()
    for word in _WORD.findall(_FIELD.sub(" ", text.lower())):
        found |= {word, *word.split("_")}  # write_offsets also reads as "write" and "offsets"
    return {w for w in found if len(w) > 1 and w not in COMMON_WORDS and not w.isdigit()}


def _without_ending(text: str) -> str:
    """``text`` without our messages' ending (``[<code>] Run 'kvcanary explain ...' or see URL``)."""
    return re.sub(r"\s*\[KVC-[A-Z]\d{3}\].*$", "", text.strip(), flags=re.DOTALL | re.IGNORECASE)


def match_message(text: str, registry: Mapping[str, ErrorEntry] | None = None, *, best: int = 3) -> list[Match]:
    """The entries a pasted message belongs to, best first.

    One :class:`Match` when the text names a registered code or exactly one message pattern
    matches best; every entry whose pattern matched equally well (one message may belong to
    several entries: the one sharing most words with the entry's title and meaning first); else
    ``best`` entries ranked by shared words.
    """
    registry = REGISTRY if registry is None else registry
    for found in _CODE.findall(text):
        if found.upper() in registry:
            return [Match(found.upper(), "code")]
    body = _without_ending(text)
    hits = []
    for code, entry in registry.items():
        for template in templates(entry):
            found = _pattern(template).search(body)
            if found is not None:
                literal = literal_length(template)
                hits.append(Match(code, "template", template, tuple(v.strip() for v in found.groups()), (), literal))
    if hits:
        hits.sort(key=lambda m: (-m.score, m.code))
        top = list({m.code: m for m in hits if m.score == hits[0].score}.values())
        if len(top) > 1:  # one message under several entries: all of them, the most topical first
            pasted = words(body)
            topical = {m.code: len(pasted & words(f"{registry[m.code].title} {registry[m.code].meaning}")) for m in top}
            top.sort(key=lambda m: -topical[m.code])
        return top
    return _by_words(body, registry)[:best]


def _by_words(text: str, registry: Mapping[str, ErrorEntry]) -> list[Match]:
    pasted = words(text)
    plain = " ".join(text.lower().split())
    ranked = []
    for code, entry in registry.items():
        known = words(entry.title)
        nearest, ratio = "", 0.0
        for template in templates(entry):
            known |= words(template)
            shape = " ".join(_FIELD.sub(" ", template.lower()).split())
            alike = difflib.SequenceMatcher(None, plain, shape).ratio()
            if alike > ratio:
                nearest, ratio = template, alike
        shared = pasted & known
        overlap = len(shared) / len(pasted | known) if pasted or known else 0.0
        score = 0.6 * overlap + 0.4 * ratio
        ranked.append(Match(code, "words", nearest, (), tuple(sorted(shared)), round(score, 4)))
    ranked.sort(key=lambda m: (-m.score, m.code))
    return ranked
