"""Prompts of a chosen length filled with real web text, for benchmarks that time an LLM backend."""

from __future__ import annotations

import json

from models.config import REPO_ROOT

SAMPLE = REPO_ROOT / "data" / "crag_sample.jsonl"


def sample_text() -> str:
    """The CRAG sample's page snippets and questions, joined: real web text to fill prompts with."""
    parts = []
    for line in SAMPLE.read_text().splitlines():
        item = json.loads(line)
        parts.append(item["query"])
        parts.extend(result.get("page_snippet") or "" for result in item.get("search_results", []))
    return "\n".join(p for p in parts if p)


def conversations(tokenizer, count: int, tokens: int) -> list[list[dict[str, str]]]:
    """`count` conversations of about `tokens` tokens each, each a different stretch of the sample's text."""
    ids = tokenizer(sample_text(), add_special_tokens=False)["input_ids"]
    while len(ids) < (count + 1) * tokens:
        ids = ids + ids
    out = []
    for i in range(count):
        text = tokenizer.decode(ids[i * tokens // 2: i * tokens // 2 + tokens])
        out.append([{"role": "system", "content": "Answer from the references, or say i don't know."},
                    {"role": "user", "content": f"References:\n{text}\nQuestion: what is described above?"}])
    return out
