"""Answer strings: "i don't know" and "invalid question" normalisation, matching, and the grader's 75-token limit.

The grader cuts every answer to 75 tokens of the Llama-2 tokenizer (utils/grader_tokens.py) before judging. An
answer over that limit is cut here first, at a clause or list boundary, so the grader never sees half a number
or half a name; one with no such boundary that fits becomes "i don't know".
"""

from __future__ import annotations

import re
import unicodedata

from utils.grader_tokens import GRADER_MAX_TOKENS, grader_token_count

IDK = "i don't know"
INVALID = "invalid question"
_IDK_MARKERS = ("i don't know", "i do not know", "i dont know", "i don't have enough information",
                "i'm not sure", "i am not sure")
# Where an over-long answer may end: before a comma, semicolon or colon that separates clauses or list items,
# after a full stop, question or exclamation mark or a closing bracket, or before a joining "and" / "or" / "but".
# Each mark must be followed by a space, so "1,234", "3.5" and "U.S." are never split.
_CLAUSE_END = re.compile(r"(?P<before>\s*[,;:](?=\s)|\s+(?=(?:and|or|but)\s))|(?P<after>[.!?)\]])(?=\s)")


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


# An answer that opens by denying what the question takes for granted: "No.", "None of ...", "There is no ...",
# "X did not ...", "The premise ...".
_REJECTS = re.compile(r"^\W*(?:no\b|none\b|not\b|nobody\b|never\b|there (?:is|are|was|were|has been|have been) no\b"
                      r"|\w+ (?:is|are|was|were|did|does|do|has|have) not\b|\w+ (?:isn't|aren't|wasn't|weren't|didn't"
                      r"|doesn't|hasn't|haven't)\b|(?:this|the) (?:question|premise)\b|invalid\b|false premise)")


def rejects_premise(text: str) -> bool:
    """Whether `text` opens by rejecting the question's premise (`_REJECTS`) rather than answering it."""
    return bool(_REJECTS.match(normalize_text(text)))


def whole_words(needle: str) -> re.Pattern[str]:
    """`needle` as whole words; a number whole too, so "23" is not in "123", "2.3", "23.5" or "1,230"."""
    before = r"(?<!\w)" + (r"(?<!\d[.,])" if needle[:1].isdigit() else "")
    after = r"(?!\w)" + (r"(?![.,]\d)" if needle[-1:].isdigit() else "")
    return re.compile(before + re.escape(needle) + after)


def contains_answer(text: str, answers: list[str]) -> bool:
    """Whether any of `answers` occurs in `text` as whole words (`whole_words`), after normalisation."""
    haystack = normalize_text(text)
    for answer in answers:
        needle = normalize_text(str(answer))
        if needle and whole_words(needle).search(haystack):
            return True
    return False


def fit_to_grader(text: str, max_tokens: int = GRADER_MAX_TOKENS) -> str | None:
    """`text` when the grader keeps it whole, else its longest prefix that ends at a clause or list boundary and
    fits in max_tokens grader tokens; None when no such prefix exists."""
    if grader_token_count(text) <= max_tokens:
        return text
    ends = sorted({m.start() if m.group("before") else m.end() for m in _CLAUSE_END.finditer(text)}, reverse=True)
    for end in ends:
        prefix = text[:end].rstrip()
        if prefix and grader_token_count(prefix) <= max_tokens:
            return prefix
    return None


def final_answer(text: str | None) -> tuple[str, str | None]:
    """(the string the grader gets, why it differs from the model's answer or None): canonical "i don't know" /
    "invalid question", else the answer on one line, cut at a clause boundary when it is over the grader's limit."""
    if text is None or is_idk(text):
        return IDK, None
    if is_invalid(text):
        return INVALID, None
    line = " ".join(text.split())
    fitted = fit_to_grader(line)
    if fitted is None:
        return IDK, f"answer of {grader_token_count(line)} grader tokens with no clause boundary within the limit"
    if fitted != line:
        return fitted, f"answer cut at a clause boundary from {grader_token_count(line)} grader tokens"
    return fitted, None
