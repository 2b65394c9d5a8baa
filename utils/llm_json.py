"""JSON from LLM output: the first object or list in the text, repaired where a model commonly breaks it."""

from __future__ import annotations

import json
import re
from typing import Any

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_PY_LITERALS = {"None": "null", "True": "true", "False": "false"}


def _span(text: str, opener: str) -> str | None:
    """From the first `opener` to its matching closer (brackets inside strings ignored); output cut off before
    its end gets the closers of what is still open."""
    start = text.find(opener)
    if start < 0:
        return None
    stack: list[str] = []
    quote, escaped = "", False
    for i in range(start, len(text)):
        char = text[i]
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
            continue
        if char in "\"'":
            quote = char
        elif char in "{[":
            stack.append("}" if char == "{" else "]")
        elif char in "}]" and stack:
            stack.pop()
            if not stack:
                return text[start:i + 1]
    return text[start:] + quote + "".join(reversed(stack))


def _repairs(candidate: str) -> list[str]:
    fixed = _TRAILING_COMMA.sub(r"\1", candidate)
    fixed = re.sub(r"\b(None|True|False)\b", lambda m: _PY_LITERALS[m.group(1)], fixed)
    attempts = [candidate, fixed]
    if '"' not in fixed:
        attempts.append(fixed.replace("'", '"'))
    return attempts


def parse_llm_json(text: str, expected: type) -> Any:
    """The first JSON value of type `expected` (dict or list) in `text`, repaired if need be; None if none parses.

    Tries fenced blocks first, then the text itself; repairs trailing commas, Python literals, single quotes and
    output cut off before its closing brackets.
    """
    opener = "{" if expected is dict else "["
    sources = _FENCE.findall(text or "") + [text or ""]
    for source in sources:
        candidate = _span(source, opener)
        if candidate is None:
            continue
        for attempt in _repairs(candidate):
            try:
                value = json.loads(attempt)
            except json.JSONDecodeError:
                continue
            if isinstance(value, expected):
                return value
    return None
