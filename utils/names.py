"""A name as a question writes it ("meta", "beyonce", "lakers") against the names a knowledge source stores
("Meta Platforms, Inc. Class A", "Beyoncé", "Los Angeles Lakers")."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

from rapidfuzz import fuzz, process

# At or above this score a stored name is taken for the written one: the same words, the written words inside a
# longer name, or a spelling within about one edit in ten characters ("eifel tower").
MATCH = 0.72


def fold(text: str) -> str:
    """Lower case, accents and punctuation dropped, whitespace collapsed: "Beyoncé" and "beyonce" fold alike."""
    text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    return " ".join(re.sub(r"[^\w\s]|_", " ", text.casefold()).split())


def _words(name: str, ignore: frozenset[str]) -> list[str]:
    words = fold(name).split()
    return [w for w in words if w not in ignore] or words


def name_score(wanted: str, stored: str, ignore: frozenset[str] = frozenset()) -> float:
    """How well `stored` matches `wanted`, in 0..1, after folding and leaving out the `ignore` words ("inc",
    "class"): 1 for the same words; 0.8 to 1 when every written word is in the stored name, more the fewer words
    it adds; else 0.8 x the edit-distance similarity of the two."""
    a, b = _words(wanted, ignore), _words(stored, ignore)
    if not a or not b:
        return 0.0
    if a == b:
        return 1.0
    if set(a) <= set(b):
        return 0.8 + 0.2 * len(set(a)) / len(set(b))
    return 0.8 * fuzz.ratio(" ".join(a), " ".join(b)) / 100


def best_matches(wanted: str, names: Iterable[str], ignore: frozenset[str] = frozenset(), limit: int = 1,
                 threshold: float = MATCH) -> list[str]:
    """The stored names that match `wanted`: the one with the same words if there is one, else up to `limit`
    of those at or above `threshold`, best first (the source's order among equals); [] when none matches."""
    scored = [(name_score(wanted, name, ignore), i, name) for i, name in enumerate(dict.fromkeys(names))]
    good = sorted((s for s in scored if s[0] >= threshold), key=lambda s: (-s[0], s[1]))
    exact = [name for score, _, name in good if score == 1.0]
    return exact or [name for _, _, name in good[:limit]]


def closest(typed: str, choices: Iterable[str]) -> str | None:
    """The choice a mistyped name most likely meant (rapidfuzz's ratio, at least 60 of 100), for "did you mean"
    hints; None when none is close."""
    found = process.extractOne(str(typed), [str(c) for c in choices], scorer=fuzz.ratio, score_cutoff=60)
    return found[0] if found else None


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """"; did you mean 'x'?" for the closest choice, else "; one of [...]": the hint every unknown name gets."""
    choices = [str(c) for c in choices]
    close = closest(name, choices)
    return f"; did you mean {close!r}?" if close else f"; one of {choices}"
