"""Text to sentences (blingfire) and sentences to chunks of bounded length."""

from __future__ import annotations

import blingfire


def split_sentences(text: str) -> list[str]:
    """Sentences of each line of `text`; a line never joins the next (lines are block elements)."""
    sentences: list[str] = []
    for line in text.splitlines():
        if line.strip():
            sentences.extend(s for s in blingfire.text_to_sentences(line).split("\n") if s.strip())
    return sentences


def group_sentences(sentences: list[str], max_chars: int) -> list[str]:
    """Consecutive sentences joined up to max_chars; a longer sentence is cut to max_chars."""
    chunks: list[str] = []
    current = ""
    for sentence in sentences:
        sentence = sentence[:max_chars]
        if current and len(current) + 1 + len(sentence) > max_chars:
            chunks.append(current)
            current = sentence
        else:
            current = f"{current} {sentence}" if current else sentence
    if current:
        chunks.append(current)
    return chunks
