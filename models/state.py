"""QueryState: one query's inputs, intermediate results and trace as it moves through the stages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Reference:
    """A piece of evidence shown to the LLM, with where it came from."""

    text: str
    kind: str  # "chunk", "snippet" or "table"; the KG stage adds "kg"
    page_name: str = ""
    page_url: str = ""
    page_last_modified: str = ""
    score: float = 0.0


@dataclass
class StageRecord:
    stage: str
    status: str  # "ok", "skipped" or "failed"
    seconds: float = 0.0
    note: str = ""


@dataclass
class QueryState:
    index: int
    interaction_id: str
    query: str
    query_time: str
    pages: list[dict[str, Any]]
    references: list[Reference] = field(default_factory=list)
    domain: str | None = None         # attributes: finance, sports, music, movie, open
    dynamism: str | None = None       # attributes: static, slow-changing, fast-changing, real-time
    knowledge: str | None = None      # the knowledge extractor's answer ("an answer from another agent")
    calculations: list[str] = field(default_factory=list)  # "expression = value", from the calculator
    llm_output: str | None = None
    answer: str | None = None
    done: bool = False
    done_reason: str = ""
    trace: list[StageRecord] = field(default_factory=list)

    def finish(self, answer: str, reason: str) -> None:
        """Fix the answer now; later LLM stages leave this query alone."""
        self.answer = answer
        self.done = True
        self.done_reason = reason
