"""Answer strings: "i don't know" and "invalid question" normalisation, matching, 75-token trimming."""

from __future__ import annotations

import re
import unicodedata
from typing import Any

IDK = "i don't know"
INVALID = "invalid question"
MAX_ANSWER_TOKENS = 75
_IDK_MARKERS = ("i don't know", "i do not know", "i dont know", "i don't have enough information",
                "i'm not sure", "i am not sure")
# Words, numbers and single symbols: close to (and never fewer than) what a BPE tokenizer counts for
# plain English, so trimming to 75 of these stays within the grader's 75-token cut.
_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def normalize_text(text: str) -> str:
    """Lower case, unicode quotes to ASCII, whitespace collapsed, trailing full stops dropped."""
    text = unicodedata.normalize("NFKC", text).replace("\u2019", "'").replace("\u2018", "'")
    text = text.replace("\u201c", '"').replace("\u201d", '"')
    return " ".join(text.lower().split()).rstrip(" .")


def is_idk(text: str) -> bool:
    normalized = normalize_text(text)
    return not normalized or any(marker in normalized for marker in _IDK_MARKERS)


def is_invalid(text: str) -> bool:
    return normalize_text(text).startswith(INVALID)


def contains_answer(text: str, answers: list[str]) -> bool:
    """Whether any of `answers` occurs in `text` as whole words, after normalisation."""
    haystack = normalize_text(text)
    for answer in answers:
        needle = normalize_text(str(answer))
        if needle and re.search(rf"(?<!\w){re.escape(needle)}(?!\w)", haystack):
            return True
    return False


def trim_to_tokens(text: str, max_tokens: int = MAX_ANSWER_TOKENS, tokenizer: Any = None) -> str:
    """`text` cut to max_tokens tokens of `tokenizer` (a transformers tokenizer), else of the word-token rule.

    With a tokenizer the cut falls on a token boundary and the kept tokens are decoded back.
    """
    if tokenizer is not None:
        ids = tokenizer.encode(text, add_special_tokens=False)
        return text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens]).strip()
    for count, match in enumerate(_TOKEN.finditer(text), start=1):
        if count == max_tokens:
            return text[:match.end()]
    return text


def final_answer(text: str | None, tokenizer: Any = None) -> str:
    """The string the grader gets: canonical IDK / invalid, else the trimmed answer on one line."""
    if text is None or is_idk(text):
        return IDK
    if is_invalid(text):
        return INVALID
    return trim_to_tokens(" ".join(text.split()), tokenizer=tokenizer)
