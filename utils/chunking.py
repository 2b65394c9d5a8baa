"""Text to sentences (blingfire) and sentences to chunks by the seed's rules.

The rules (section 4.1 of the seed paper): a sentence longer than a threshold is truncated; a question (it starts
with a 5W1H or auxiliary word, or ends with "?") takes the text that follows it, up to the chunk length, so a FAQ
keeps each question with its answer; the other sentences are grouped in threes.
"""

from __future__ import annotations

import re

import blingfire

QUESTION_WORDS = frozenset(
    "what when where who whom whose which why how "
    "is are was were am do does did can could will would shall should may might must has have had".split()
)


_WORD = re.compile(r"[^\W_]")  # a letter or a digit


def split_sentences(text: str) -> list[str]:
    """Sentences of each line of `text`; a line never joins the next (lines are block elements).

    A "sentence" without a letter or a digit (separators, bullets, replacement characters) is left out.
    """
    sentences: list[str] = []
    for line in text.splitlines():
        if _WORD.search(line):
            sentences.extend(s for s in blingfire.text_to_sentences(line).split("\n") if _WORD.search(s))
    return sentences


def is_question(sentence: str) -> bool:
    stripped = sentence.strip()
    if stripped.endswith("?"):
        return True
    first = stripped.split(maxsplit=1)[0].lower().strip("\"'“‘(*-") if stripped else ""
    return first in QUESTION_WORDS


def seed_chunks(sentences: list[str], sentence_chars: int, chunk_chars: int, group_size: int = 3) -> list[str]:
    """Chunks by the seed's rules; each sentence is cut to sentence_chars first."""
    chunks: list[str] = []
    group: list[str] = []
    question: list[str] = []  # a question and the answer text collected after it

    def flush_group() -> None:
        if group:
            chunks.append(" ".join(group))
            group.clear()

    def flush_question() -> None:
        if question:
            chunks.append(" ".join(question))
            question.clear()

    for raw in sentences:
        sentence = raw.strip()[:sentence_chars].rstrip()
        if not sentence:
            continue
        if is_question(sentence):
            flush_group()
            flush_question()
            question.append(sentence)
        elif question and len(" ".join(question)) + 1 + len(sentence) <= chunk_chars:
            question.append(sentence)
        else:
            flush_question()
            group.append(sentence)
            if len(group) == group_size:
                flush_group()
    flush_question()
    flush_group()
    return chunks


def sentence_units(text: str, min_chars: int, max_chars: int) -> list[str]:
    """HASH-RAG's sentence-level propositions: the sentences of `text`, a short one joined to the next (so a
    unit says something on its own), a long one truncated."""
    units: list[str] = []
    pending = ""
    for sentence in split_sentences(text):
        pending = f"{pending} {sentence}".strip()
        if len(pending) >= min_chars:
            units.append(pending[:max_chars])
            pending = ""
    if pending:
        if units and len(units[-1]) + len(pending) < max_chars:
            units[-1] = f"{units[-1]} {pending}"
        else:
            units.append(pending[:max_chars])
    return units
