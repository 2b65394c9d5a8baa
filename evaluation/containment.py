"""Whether a prediction gives a gold answer, read by rules: the gold answer occurs in it as whole words, and no
guard reads that occurrence as something other than the answer. Containment of the gold answer is the "acc"
metric of FlashRAG and many QA papers; the guards keep it from counting a hedge or a denial as an answer.

Both texts are first put in one form (`canonical`): `normalize_text`, then dates, number words, thousands
separators, currency, scale words, percentages and a few units, so "160,000,000 dollars" holds "$160 million",
"31 March 1889" holds "march 31, 1889" and "sixty days" holds "60". Numbers match whole: "23" is not in "123",
"2.3" or "23.5" (`utils.answers.whole_words`). A full date holds its month and year and its year ("1889" is in
"March 31, 1889"), never a day or month number alone.

An occurrence of a gold answer does not count when, in its clause,

- it is negated: "not X", "never X", "isn't X", "X did not ...", "X is not ...";
- it is set against another: "older than X", "more than X", "rather than X", "instead of X";
- it is hedged: "X or Y", "Y or X", "either X";
- it is one item of a list that names other candidates: "Nolan, Spielberg and Lucas" (items of a few words
  without verbs, pronouns or prepositions: "Nolan, who directed it in 2010" is no list).

A gold answer that is itself a list ("red, yellow and blue") needs every item, in any order, and no other
candidate listed beside them ("red, yellow, blue and green" is wrong). A gold "yes" or "no" needs the prediction
to start with it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from decimal import Decimal

from utils.answers import normalize_text, whole_words

MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
          "november", "december")
_MONTH = (r"(?P<month>jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
          r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?")
_DATES = (re.compile(r"(?<![\w.])(?P<year>\d{4})-(?P<mm>\d{1,2})-(?P<day>\d{1,2})(?!\d)"),
          re.compile(rf"\b{_MONTH}\s+(?P<day>\d{{1,2}})(?:st|nd|rd|th)?,?\s+(?P<year>\d{{4}})(?!\d)"),
          re.compile(rf"(?<![\w.])(?P<day>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH},?\s+(?P<year>\d{{4}})(?!\d)"))

_SMALL = {word: value for value, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen".split())}
_TENS = {word: 10 * value for value, word in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(),
                                                         start=2)}


def _words(words: Iterable[str]) -> str:
    return "|".join(sorted(words, key=len, reverse=True))


_UNDER_100 = rf"(?:(?:{_words(_TENS)})(?:[- ](?:{_words(list(_SMALL)[1:10])}))?|(?:{_words(_SMALL)}))"
_NUMBER_WORDS = re.compile(rf"\b(?:(?:{_words(list(_SMALL)[1:10])}) hundred(?:(?: and)? {_UNDER_100})?|{_UNDER_100})\b")
_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?!\d|,\d)")
_CURRENCY = re.compile(r"(?:\bus)?\$\s*(?=\d)|(?<=\d)\s+(?:us\s+)?(?:dollars?|usd)\b")
_SCALE = re.compile(r"(?<![\d.])(?P<number>\d+(?:\.\d+)?)\s*(?P<scale>thousand|million|billion|trillion|bn)\b")
_SCALES = {"thousand": 3, "million": 6, "billion": 9, "bn": 9, "trillion": 12}
_PERCENT = re.compile(r"(?<=\d)\s*(?:%|percent\b|per cent\b)")
_UNITS = tuple((re.compile(rf"(?<=\d)\s*(?:{pattern})\b"), f" {unit}") for pattern, unit in (
    ("kilometres|kilometers|kilometre|kilometer|km", "km"), ("centimetres|centimeters|centimetre|centimeter|cm", "cm"),
    ("metres|meters|metre|meter|m", "m"), ("kilograms|kilogram|kgs|kg", "kg"), ("feet|foot|ft", "ft"),
    ("miles|mile|mi", "mi")))


def _date(match: re.Match[str]) -> str:
    month = int(match["mm"]) if match.groupdict().get("mm") else 1 + next(
        i for i, name in enumerate(MONTHS) if name.startswith(match["month"][:3]))
    day, year = int(match["day"]), match["year"]
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return match.group(0)
    return f"{year}_{month:02d}_{day:02d} {MONTHS[month - 1]} {year}"


def _number(match: re.Match[str]) -> str:
    total = 0
    for word in re.split(r"[- ]", match.group(0)):
        if word == "hundred":
            total *= 100
        elif word != "and":
            total += _SMALL.get(word, _TENS.get(word, 0))
    return str(total)


def _scaled(match: re.Match[str]) -> str:
    text = format(Decimal(match["number"]) * 10 ** _SCALES[match["scale"]], "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def canonical(text: str) -> str:
    """`text` normalised (`normalize_text`) with dates as "1889_03_31 march 1889", number words as digits, no
    thousands separators or currency, scale words multiplied out, "%" for percent and short unit names."""
    text = normalize_text(text)
    for pattern in _DATES:
        text = pattern.sub(_date, text)
    text = _NUMBER_WORDS.sub(_number, text)
    text = _THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), text)
    text = _SCALE.sub(_scaled, _CURRENCY.sub("", text))
    text = _PERCENT.sub("%", text)
    for pattern, unit in _UNITS:
        text = pattern.sub(unit, text)
    return text


# A clause ends at these marks (a full stop not inside a number); the guards never look past it.
_CLAUSE_END = re.compile(r"[;:!?()\[\]]|\.(?!\d)|\s[-\u2013\u2014]\s")
# List items are separated by commas and by "and", "or" or "&" between spaces.
_SEPARATOR = re.compile(r"\s*,\s*(?:(?:and|or|&)\s+)?|\s+(?:and|or|&)\s+")
_CONJUNCTION = re.compile(r"\b(?:and|or)\b|&")
_NEGATED_BEFORE = re.compile(r"(?:\b(?:not|never|nor|neither)|n't)\s+(?:(?!but\b)[^\s,]+\s+){0,2}[^\w\s]*$")
_NEGATED_AFTER = re.compile(r"^[^\w\s]*(?:'s)?\s+(?:(?:(?:is|was|are|were|has|had|have|did|does|do|could|would|will"
                            r"|can)\s+)?(?:not|never)\b|\w+n't\b|cannot\b)")
_AGAINST = re.compile(r"\b(?:than|instead\s+of)\s+(?:(?!but\b)[^\s,]+\s+){0,2}[^\w\s]*$")
_HEDGED_BEFORE = re.compile(r"\b(?:or\s+(?:(?:maybe|perhaps|possibly|probably)\s+)?|either\s+)(?:the\s+)?[^\w\s]*$")
_HEDGED_AFTER = re.compile(r"^[^\w\s]*\s+or\s+(?!not\b)\w")
# The opening words before a list's first item: "the directors were Nolan", "directed by Nolan".
_LEAD = r".*\b(?:is|are|was|were|include|includes|including|namely|by)\s+"
_ITEM_PREFIX = re.compile(rf"(?:{_LEAD})?(?:the\s+)?\W*")
_ITEM_LEAD = re.compile(_LEAD)
# Words that make a comma-separated piece a clause rather than a candidate's name.
_NOT_A_NAME = frozenset("is was are were be been has had have did does do will would can could who whom which that "
                        "it he she they we i you his her its their in on at to from with for by as when while after "
                        "before since than not never".split())
_LIST_WORDS = 3  # a candidate of a list has at most this many words


def _clause(text: str, start: int, end: int) -> tuple[int, int]:
    """The clause around text[start:end]: from the last clause mark before it to the first after it."""
    begin = max((m.end() for m in _CLAUSE_END.finditer(text, 0, start)), default=0)
    after = _CLAUSE_END.search(text, end)
    return begin, after.start() if after else len(text)


def _pieces(text: str, begin: int, end: int) -> tuple[list[tuple[int, int]], bool]:
    """The clause's comma- and conjunction-separated pieces, and whether a conjunction joins any."""
    pieces, position, joined = [], begin, False
    for match in _SEPARATOR.finditer(text, begin, end):
        pieces.append((position, match.start()))
        position, joined = match.end(), joined or bool(_CONJUNCTION.search(match.group(0)))
    return [*pieces, (position, end)], joined


def _candidate(piece: str) -> bool:
    """Whether a list piece reads as a candidate answer, after its opening words ("the directors were"): a few
    words, none of them a verb, pronoun or preposition."""
    words = re.findall(r"[\w'&.-]+", _ITEM_LEAD.sub("", piece, count=1))
    return 1 <= len(words) <= _LIST_WORDS and not _NOT_A_NAME.intersection(words)


def _in_list(text: str, gold: str, start: int, end: int, clause: tuple[int, int]) -> bool:
    """Whether text[start:end] is one item of a list in its clause that names another candidate."""
    pieces, joined = _pieces(text, *clause)
    own = next((p for p in pieces if p[0] <= start and end <= p[1]), None)
    if own is None or text[end:own[1]].strip(" \"'") or not _ITEM_PREFIX.fullmatch(text[own[0]:start]):
        return False
    pattern = whole_words(gold)
    others = [text[a:b] for a, b in pieces if (a, b) != own and not pattern.search(text[a:b])]
    listed = joined or (len(pieces) >= 3 and all(_candidate(text[a:b]) for a, b in pieces if (a, b) != own))
    return listed and any(_candidate(piece) for piece in others)


def _guard(text: str, gold: str, start: int, end: int, single: bool) -> str | None:
    """Why the occurrence text[start:end] of `gold` is not given as the answer; None when it is."""
    clause = _clause(text, start, end)
    before, after = text[clause[0]:start], text[end:clause[1]]
    if _NEGATED_BEFORE.search(before) or _NEGATED_AFTER.match(after):
        return "negated"
    if _AGAINST.search(before):
        return "set against another (than, instead of)"
    if _HEDGED_BEFORE.search(before) or _HEDGED_AFTER.match(after):
        return "hedged (or)"
    if single and _in_list(text, gold, start, end, clause):
        return "one of a list that names other candidates"
    return None


def _occurs(text: str, gold: str, single: bool) -> tuple[re.Match[str] | None, str]:
    """The first occurrence of `gold` that no guard rejects, else None and the first guard's reason ("" where
    `gold` does not occur)."""
    reason = ""
    for match in whole_words(gold).finditer(text):
        guard = _guard(text, gold, match.start(), match.end(), single)
        if guard is None:
            return match, ""
        reason = reason or f"{gold!r} {guard}"
    return None, reason


def _holds(text: str, gold: str) -> tuple[bool, str]:
    """(whether the canonical prediction `text` gives the canonical gold answer, why)."""
    if gold in ("yes", "no"):
        first = re.match(r"\W*(\w+)", text)
        return (True, f"starts with {gold!r}") if first and first.group(1) == gold else (False, "")
    items = [item for item in re.split(r"\s*,\s*(?:and\s+)?|\s+and\s+", gold) if item]
    if len(items) == 1:
        match, reason = _occurs(text, gold, single=True)
        return (True, f"{gold!r} in the prediction") if match else (False, reason)
    found = [_occurs(text, item, single=False) for item in items]
    missing = [item for item, (match, _) in zip(items, found) if match is None]
    if missing:
        reasons = [reason for _, reason in found if reason]
        partial = len(missing) < len(items)
        return False, reasons[0] if reasons else (f"only part of the list {gold!r}" if partial else "")
    for clause in {_clause(text, match.start(), match.end()) for match, _ in found if match}:
        pieces, _ = _pieces(text, *clause)
        extra = [text[a:b] for a, b in pieces
                 if _candidate(text[a:b]) and not any(whole_words(item).search(text[a:b]) for item in items)]
        if extra:
            return False, f"names {extra[0].strip()!r} beside the list {gold!r}"
    return True, f"every item of {gold!r} in the prediction"


def contains_gold(prediction: str, golds: Sequence[str]) -> tuple[bool, str]:
    """(whether `prediction` gives one of `golds`, the reason): see the module's docstring."""
    text, reasons = canonical(prediction), []
    for gold in golds:
        holds, reason = _holds(text, canonical(str(gold)))
        if holds:
            return True, reason
        reasons.append(reason)
    return False, next((reason for reason in reasons if reason), "no gold answer in the prediction")
