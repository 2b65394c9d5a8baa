"""What a prediction says against the gold answer's key fact, read by rules: the features the answer-equivalence
judge (evaluation/facts_judge.py) weighs.

CRAG's gold answers are often sentences ("eminem released the album "revival" in 2017, which included ...") and a
real model answers in its own words ("Revival."). Containment looks for the whole gold in the prediction; these
rules read the gold for its key fact instead: the words of the gold that the question does not already hold. Both
texts are put in one form first (`evaluation.containment.canonical`: dates, number words, separators, currency,
scale words), then:

- numbers are compared by value: a prediction's number matches a gold number when it is that number rounded or
  cut at the prediction's own precision and within 5% of it ("$2.5 million" for 2,543,000; "10 trillion" for 9.552
  trillion; not "about 200 million" for 160 million), never a bound ("at least 3", "over five");
- dates in day/month/year and month/day/year figures are read as dates (`_numeric_dates`);
- names are read with their aliases and codes (countries, US states and languages from pycountry: "usa" and
  "the united states", "az" and "arizona", "en" and "english");
- a gold list is read by its items, and the prediction's own list for items the gold does not name;
- a comparison ("which ..., a or b?") by the option the gold names and the one the prediction names first;
- a yes/no by the first word, an "invalid question" by whether the prediction rejects the premise.

Containment's verdict and the reason of its guards (negation, hedges, a wrong candidate in a list) are features
too. No feature reads anything but the question, the gold answers and the prediction. Where the gold's form leaves
the reading certain (`decisive`: a yes/no, a win/loss code, an invalid question, a number, a date), rules give the
verdict and the classifier is not asked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import cache, lru_cache

from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

from evaluation.containment import canonical, contains_gold
from evaluation.verdicts import CORRECT, WRONG
from utils.answers import IDK, INVALID, normalize_text, rejects_premise

FEATURES = ("contains", "contains_guard", "sentence_gold", "gold_words", "key_recall", "key_all", "pred_precision",
            "pred_extra", "pred_words", "short_precise", "num_gold", "num_match", "num_conflict", "num_bound",
            "yesno_agree", "yesno_disagree", "date_match", "date_year_only", "cmp_gold", "cmp_other",
            "cmp_gold_first", "cmp_numbers", "list_gold", "list_missing", "list_extra", "invalid_gold",
            "premise_rejected", "no_answer_cue", "idk_gold", "cut_short")

_TOKEN = re.compile(r"[a-z0-9_]+(?:[.'][a-z0-9]+)*%?")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w])")
_BOUND = re.compile(r"\b(?:at least|over|more than|less than|fewer than|under|up to|at most)\s+$")
_NUMERIC_DATE = re.compile(r"(?<![\d/.])(\d{1,2})[/.](\d{1,2})[/.](\d{4})(?![\d/]|\.\d)")
_NO_ANSWER = re.compile(r"\b(?:not (?:specified|mentioned|provided|available|stated|given|found|known|clear)|no "
                        r"(?:information|data|mention|record)|unknown|unable to|cannot (?:be )?(?:determine|find|"
                        r"answer)|don't have|do not have|not able to)\b")
_LIST_SPLIT = re.compile(r"\s*(?:,|;|\n|\band\b|&)\s*|\s*\n?\s*\d+[.)]\s+")
_OPTIONS = re.compile(r"(?:^|[,:?]|\bbetween\b|\b(?:does|do|did|is|are|was|were|has|have|had|who|which)\b)\s*"
                      r"(?P<a>[^,:?]{1,60}?)\s+(?:or|and)\s+(?P<b>[^,:?]{1,60}?)\s*(?:[,?.]|$|\b(?:have|has|had|"
                      r"is|are|was|were|in|on|at)\b)")
_ARTICLE = re.compile(r"^(?:the|a|an)\s+")
_LIST_LEAD = re.compile(r"^.*?\b(?:are|were|is|was|include|includes|included)\s+|^.*:\s*")
_LIST_TAIL = re.compile(r"\s+(?:have|has|had|are|were|is|was|all|both|each|together)\b.*$")
LIST_ITEM = 6  # words of a list item at most
_MORE = re.compile(r"\b(?:more|most|higher|highest|larger|bigger|greater|longer|taller|heavier|expensive|richer"
                   r"|older)\b")
_LESS = re.compile(r"\b(?:less|fewer|lower|smaller|shorter|cheaper|lighter)\b")
_UNIT_WORDS = frozenset({"m", "km", "cm", "kg", "ft", "mi", "years", "year", "old", "times", "points", "percent",
                         "usd", "dollars", "million", "billion"})
_FULL_DATE = re.compile(r"\d{4}_\d\d_\d\d")  # a full date as `canonical` writes it
_STEM = 5  # content words match on their first letters: "released" is "release", "members" is "member"
ROUND_FIGURE = 1000  # from here up, trailing zeros may be a rounding ("$65,000"); under it, "30" is thirty
ROUNDING = Decimal("0.05")  # a rounded number is at most this far from the gold, relatively
LONG_GOLD = 6  # a gold of more words than this is a sentence, not an answer
SHORT = 4  # a prediction of at most this many content words, all of them the gold's, is the gold's key fact


@dataclass(frozen=True)
class Reading:
    """A canonical text with its content tokens (stemmed, aliases added) and its numbers."""

    text: str
    tokens: frozenset[str]
    numbers: tuple[tuple[Decimal, Decimal, int, str], ...]  # (value, unit of its last written digit, position, text)


def _stem(token: str) -> str:
    return token if token[:1].isdigit() else token[:_STEM]


@cache
def _aliases() -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """({name: key}, {code: key} for a code that is the whole text, {code: key} for one after a comma) for
    countries, US states and languages, from pycountry. A name counts anywhere in a text, a code only alone or after
    a comma (an alpha-2 code is often an English word). Alone, a two-letter code is a language before a country
    ("en"); after a comma, a US state before a country ("tucson, az")."""
    import pycountry

    names: dict[str, str] = {}
    states: dict[str, str] = {}
    countries: dict[str, str] = {}
    languages: dict[str, str] = {}
    for country in pycountry.countries:
        key = f"country_{country.alpha_2.lower()}"
        for name in (country.name, getattr(country, "common_name", None), getattr(country, "official_name", None)):
            if name:
                names[normalize_text(name)] = key
        countries[country.alpha_2.lower()] = countries[country.alpha_3.lower()] = key
    for name in ("america", "the us", "the u.s", "u.s", "u.s.a", "usa"):
        names[name] = "country_us"
    for name in ("britain", "great britain", "the uk", "u.k"):
        names[name] = "country_gb"
    for state in pycountry.subdivisions.get(country_code="US") or ():
        key = f"state_{state.code[3:].lower()}"
        names[normalize_text(state.name)] = key
        states[state.code[3:].lower()] = key
    for language in pycountry.languages:
        if hasattr(language, "alpha_2"):
            key = f"language_{language.alpha_2}"
            names[normalize_text(language.name)] = key
            languages[language.alpha_2] = languages[language.alpha_3] = key
    three = {code: key for code, key in countries.items() if len(code) == 3}
    return names, {**states, **countries, **languages, **three}, {**languages, **countries, **states}


@cache
def _alias_pattern() -> re.Pattern[str]:
    names, _, _ = _aliases()
    return re.compile(r"(?<![\w.])(?:" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
                      + r")(?![\w])")


def _alias_keys(text: str) -> tuple[set[str], set[str]]:
    """(the alias keys of the names in `text` and of a code that is the whole text or follows its last comma, the
    words they are written in: a name and its code read as one key, not as that key beside other words)."""
    names, alone, after_comma = _aliases()
    found = [match.group(0) for match in _alias_pattern().finditer(text)]
    keys = {names[name] for name in found}
    whole, last = text.strip(), text.rsplit(",", 1)[-1].strip() if "," in text else None
    for part, table in ((whole, alone), (last, after_comma)):
        if part in table:
            keys.add(table[part])
            found.append(part)
    return keys, {_stem(word) for name in found for word in _TOKEN.findall(name)}


def _numeric_dates(text: str) -> str:
    """Day/month/year and month/day/year figures as ISO dates, both readings where both are dates, so that
    `canonical` reads them as it reads "1941-08-14"."""
    def iso(match: re.Match[str]) -> str:
        first, second, year = int(match[1]), int(match[2]), match[3]
        readings = [(m, d) for m, d in ((second, first), (first, second)) if 1 <= m <= 12 and 1 <= d <= 31]
        return " ".join(f"{year}-{m:02d}-{d:02d}" for m, d in dict.fromkeys(readings)) or match.group(0)

    return _NUMERIC_DATE.sub(iso, text)


@lru_cache(maxsize=4096)  # a judged answer's question, golds and list items are read by several features
def read(text: str) -> Reading:
    """`text` in canonical form, with its content tokens and numbers."""
    text = canonical(_numeric_dates(text))
    words = {_stem(t.strip("'")) for t in _TOKEN.findall(text) if t not in ENGLISH_STOP_WORDS}
    numbers = []
    for match in _NUMBER.finditer(text):
        written = match.group(0)
        try:
            value = Decimal(written)
        except InvalidOperation:
            continue
        decimals = len(written.split(".")[1]) if "." in written else 0
        unit = Decimal(1).scaleb(-decimals)
        zeros = len(written) - len(written.rstrip("0"))
        if decimals == 0 and zeros and zeros < len(written.lstrip("-")) and abs(value) >= ROUND_FIGURE:
            unit = Decimal(1).scaleb(zeros)  # "10000000000000" from "10 trillion": written to its trillions
        numbers.append((value, unit, match.start(), written))
    keys, named = _alias_keys(text)
    return Reading(text, frozenset(words - named | keys), tuple(numbers))


def value_match(predicted: tuple[Decimal, Decimal, int, str], gold: Decimal) -> bool:
    """Whether the predicted number is the gold number, or it rounded or cut at the prediction's precision and
    within ROUNDING of it ("about 200 million" is 160 million rounded to one digit, and not a plain rounding)."""
    value, unit = predicted[:2]
    if value == gold:
        return True
    if gold == 0 or abs(value - gold) > ROUNDING * abs(gold):
        return False
    # A written zero may be a digit of its own: "10 trillion" for 9.6 trillion is rounded to its trillions.
    for step in {unit, unit / 10} if unit > 1 else {unit}:
        if abs(gold) >= step and value in (
                (gold / step).quantize(Decimal(1), rounding=rounding) * step for rounding in ("ROUND_HALF_UP",
                                                                                            "ROUND_DOWN")):
            return True
    return False


def _options(query: str) -> tuple[str, str] | None:
    """The two options of a comparison question ("which ..., a or b?"), canonical; None where it names none."""
    text = canonical(query)
    if " or " not in text and not text.startswith("between"):
        return None
    found = None
    for match in _OPTIONS.finditer(text):
        found = match
    if found is None:
        return None
    a, b = (_ARTICLE.sub("", found[name].strip(" \"'")) for name in ("a", "b"))
    return (a, b) if a and b and a != b else None


def _position(text: str, option: str) -> int | None:
    """Where `option` is first named in `text`: the whole option, else its last word (a surname, a team's name)."""
    for needle in (option, option.split()[-1]):
        match = re.search(rf"(?<!\w){re.escape(needle)}(?!\w)", text)
        if match:
            return match.start()
    return None


def _items(text: str) -> list[str]:
    return [item.strip(" .\"'-*") for item in _LIST_SPLIT.split(text) if item and item.strip(" .\"'-*")]


def _item_found(item: str, tokens: frozenset[str]) -> bool:
    """Whether a list item is named: all its words, one long word of it, or its last word (a surname)."""
    words = read(item).tokens
    last = [_stem(w) for w in _TOKEN.findall(canonical(item)) if w not in ENGLISH_STOP_WORDS][-1:]
    return bool(words) and (words <= tokens or any(w in tokens for w in words if len(w) >= _STEM)
                            or bool(last) and last[0] in tokens)


def features(query: str, gold: str, prediction: str) -> dict[str, float]:
    """The FEATURES of one (question, gold, prediction) triple, each a number."""
    q, g, p = read(query), read(gold), read(prediction)
    key = g.tokens - q.tokens or g.tokens
    novel = p.tokens - q.tokens
    holds, why = contains_gold(prediction, [gold])
    gold_numbers = [n for n in g.numbers if n[0] not in {m[0] for m in q.numbers}]
    own = [n for n in p.numbers if n[0] not in {m[0] for m in q.numbers}]
    matched = [n for n in own if any(value_match(n, gn[0]) for gn in gold_numbers)]
    bound = any(_BOUND.search(p.text[:n[2]]) for n in matched)
    # a number given by value is the gold's word, however it is written
    found = key & p.tokens | {gn[3] for gn in gold_numbers if any(value_match(n, gn[0]) for n in own)} & key
    given = novel & g.tokens | {n[3] for n in matched} & novel
    dates = {t for t in g.tokens if _FULL_DATE.fullmatch(t)}
    first = re.match(r"\W*(\w+)", p.text)
    first_gold = re.match(r"\W*(\w+)", g.text)
    yes_no = first_gold.group(1) if first_gold and first_gold.group(1) in ("yes", "no") else None
    said = first.group(1) if first else ""
    result = {
        "contains": float(holds), "contains_guard": float(not holds and bool(why) and "no gold answer" not in why
                                                        and "only part" not in why),
        "sentence_gold": float(len(g.text.split()) > LONG_GOLD), "gold_words": math.log1p(len(g.text.split())),
        "key_recall": len(found) / len(key) if key else 0.0,
        "key_all": float(bool(key) and found == key),
        "pred_precision": len(given) / len(novel) if novel else 0.0,
        "pred_extra": math.log1p(len(novel - given)), "pred_words": math.log1p(len(p.text.split())),
        "short_precise": float(bool(novel) and len(novel) <= SHORT and novel == given),
        "date_match": float(bool(dates & p.tokens)),
        "date_year_only": float(bool(dates) and not dates & p.tokens and any(d[:4] in p.tokens for d in dates)),
        "num_gold": float(bool(gold_numbers)), "num_match": float(bool(matched) and not bound),
        "num_conflict": float(bool(gold_numbers) and bool(own) and not matched), "num_bound": float(bound),
        "yesno_agree": float(yes_no is not None and said == yes_no),
        "yesno_disagree": float(yes_no is not None and said in ("yes", "no") and said != yes_no),
        "invalid_gold": float(normalize_text(gold) == INVALID),
        "premise_rejected": float(normalize_text(gold) == INVALID and rejects_premise(prediction)),
        "no_answer_cue": float(bool(_NO_ANSWER.search(p.text))), "idk_gold": float(normalize_text(gold) == IDK),
        "cut_short": float(bool(re.search(r"(?:\n\s*\d+[.)]?\s*\w*|,|:)\s*$", prediction.strip())) or
                           not prediction.strip().endswith((".", "!", ")", '"', "'")) and len(prediction) > 150),
    }
    result.update(_comparison(query, g, p))
    result.update(_list(g, p, key))
    return result


def _comparison(query: str, g: Reading, p: Reading) -> dict[str, float]:
    none = {"cmp_gold": 0.0, "cmp_other": 0.0, "cmp_gold_first": 0.0, "cmp_numbers": 0.0}
    options = _options(query)
    if options is None:
        return none
    at = {option: _position(g.text, option) for option in options}
    named = [option for option in options if at[option] is not None]
    if not named:
        return none
    ours = min(named, key=lambda option: at[option] or 0)
    other = options[1] if ours == options[0] else options[0]
    mine, theirs = _position(p.text, ours), _position(p.text, other)
    return {"cmp_gold": float(mine is not None), "cmp_other": float(theirs is not None),
            "cmp_gold_first": float(mine is not None and (theirs is None or mine < theirs)),
            "cmp_numbers": _by_numbers(query, p, mine, theirs)}


def _by_numbers(query: str, p: Reading, mine: int | None, theirs: int | None) -> float:
    """+1 where the prediction gives each option a number and the numbers choose the gold's option by the question's
    comparative ("more", "higher", "fewer"), -1 where they choose the other, 0 where it gives no such numbers."""
    direction = 1 if _MORE.search(query) else -1 if _LESS.search(query) else 0
    if not direction or mine is None or theirs is None:
        return 0.0

    def after(start: int, stop: int) -> Decimal | None:
        found = [n[0] for n in p.numbers if start < n[2] and (n[2] < stop or stop <= start)]
        return found[0] if found else None

    ours, other = after(mine, theirs), after(theirs, mine)
    if ours is None or other is None or ours == other:
        return 0.0
    return float(direction if ours > other else -direction)


def _list(g: Reading, p: Reading, key: frozenset[str]) -> dict[str, float]:
    items = _items(g.text)
    if len(items) >= 2:  # a sentence's list: after its opening words, and up to the verb after its last item
        items[0] = _LIST_LEAD.sub("", items[0], count=1)
        items[-1] = _LIST_TAIL.sub("", items[-1], count=1)
    items = [item for item in items if read(item).tokens & key]
    if len(items) < 2 or any(len(item.split()) > LIST_ITEM for item in items):
        return {"list_gold": 0.0, "list_missing": 0.0, "list_extra": 0.0}
    found = sum(_item_found(item, p.tokens) for item in items)
    theirs = [item for item in _items(p.text) if 1 <= len(item.split()) <= LIST_ITEM]
    extra = sum(not _item_found(item, g.tokens) for item in theirs) if len(theirs) >= 2 else 0
    return {"list_gold": 1.0, "list_missing": 1 - found / len(items), "list_extra": math.log1p(extra)}


# CRAG's win/loss answers: a gold "w", "l" or "d" and the words that give it
_RESULTS = {"w": ("won", "win", "wins", "winning", "victory", "victorious", "beat"),
            "l": ("lost", "loss", "lose", "loses", "losing", "defeat", "defeated"),
            "d": ("draw", "drew", "drawn", "tie", "tied")}


def _numeric(gold: Reading) -> bool:
    """Whether a gold answer is a number and nothing else (a unit or currency aside): "38", "$160 million", "330 m"."""
    words = [t for t in _TOKEN.findall(gold.text) if t not in ENGLISH_STOP_WORDS]
    return bool(gold.numbers) and len(words) <= 3 and all(t.rstrip("%").replace(".", "").isdigit() or t in _UNIT_WORDS
                                                          for t in words) and not _FULL_DATE.search(gold.text)


def _is_date(gold: Reading) -> bool:
    """Whether a gold answer is a full date and nothing else ("1965-02-17", "march 31, 1889")."""
    words = gold.text.split()
    return bool(words) and bool(_FULL_DATE.fullmatch(words[0])) and len(words) <= 3


def decisive(query: str, golds: Sequence[str], prediction: str) -> tuple[str, str] | None:
    """(verdict, reason) where the gold's form leaves the reading certain, else None: a gold "yes" or "no" against
    the prediction's first word, a gold win/loss code ("w", "l", "d") against the word that opens the prediction, a
    gold "invalid question" against a prediction that rejects the premise, a gold that is a number against a
    prediction whose own numbers are none of it by value (or only a bound of it), a gold that is a date against a
    prediction that gives no full date, or only others."""
    first = re.match(r"\W*(\w+)", normalize_text(prediction))
    said = first.group(1) if first else ""
    readings = [read(str(g)) for g in golds if str(g).strip()]
    p = read(prediction)
    numeric = [g for g in readings if _numeric(g)]
    if numeric and len(numeric) == len(readings):
        asked = {n[0] for n in read(query).numbers}
        own = [n for n in p.numbers if n[0] not in asked]
        hits = [n for n in own if any(value_match(n, gn[0]) for g in numeric for gn in g.numbers)]
        if own and not [n for n in hits if not _BOUND.search(p.text[:n[2]])]:
            return WRONG, "the gold is a number and the prediction's numbers are not it" + (" (a bound)" * bool(hits))
    dates = [set(_FULL_DATE.findall(g.text)) for g in readings if _is_date(g)]
    if dates and len(dates) == len(readings):
        given = set(_FULL_DATE.findall(p.text))
        if not given & set().union(*dates):
            return WRONG, "the gold is a date and the prediction gives " + ("another" if given else "no full date")
    for gold in map(normalize_text, golds):
        if gold in ("yes", "no") and said in ("yes", "no"):
            return (CORRECT if said == gold else WRONG), f"a gold {gold!r} against the first word {said!r}"
        if gold in _RESULTS and any(said in words for words in _RESULTS.values()):
            return (CORRECT if said in _RESULTS[gold] else WRONG), f"a gold result {gold!r} against {said!r}"
        if gold == INVALID and rejects_premise(prediction):
            return CORRECT, "the prediction rejects the premise of an invalid question"
    return None


def best_features(query: str, golds: Sequence[str], prediction: str) -> dict[str, float]:
    """The features against the gold answer or alternative the prediction comes closest to: containment first,
    then a matched number, then the key fact's recall."""
    candidates = [features(query, gold, prediction) for gold in golds if str(gold).strip()]
    if not candidates:
        return features(query, "", prediction)
    return max(candidates, key=lambda f: (f["contains"], f["num_match"], f["key_recall"], f["pred_precision"]))
