"""The answer check: a stage from outside the project, in one file, for tests/unit/test_stage_file.py and
docs/how-to/add-a-stage.md. Everything it adds is declared here: its settings (the config section `answer_check`),
a QueryState field and its record form, a resource and what it is built from, a gate signal and its meaning, and
its LLM calls for the budget planner. A config loads it by naming this module in `stage_modules`; its prompt file
is named under the config's `prompts:`.

It asks the LLM whether the best references support the answer; with `withhold`, an unsupported answer becomes
"i don't know" (a wrong answer costs a point, "i don't know" none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from models.config import SystemConfig
from models.estimates import StagePlan, template_tokens, tokens
from models.prompting import PromptLibrary
from models.resources import Resource
from models.stages import STAGES, Stage, StageContext
from models.state import QueryState, StateField
from utils.answers import IDK, is_idk


@dataclass
class AnswerCheckSettings:
    """The answer check: the LLM reads the best references and says whether they support the answer."""

    references: int = 3
    """How many of the best references the check shows."""
    max_tokens: int = 4
    """Reply tokens of the check."""
    withhold: bool = True
    """An answer the references do not support becomes "i don't know"."""


class Similarity:
    """Cosine similarity of an answer and a text, by the system's embedder (the resource `answer_similarity`)."""

    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder

    def __call__(self, answer: str, text: str) -> float:
        vectors = np.asarray(self.embedder.encode([answer, text]), dtype=float)
        return float(vectors[0] @ vectors[1] / max(np.linalg.norm(vectors[0]) * np.linalg.norm(vectors[1]), 1e-12))


def build_similarity(config: SystemConfig, prompts: PromptLibrary, built: dict[str, Any]) -> Similarity:
    return Similarity(built["embedder"])


SUPPORT = StateField[str | None]("support", lambda: None, record=lambda value: value,
                                 doc="the check's verdict: supported, unsupported, or None where it did not run")


@STAGES.register("answer_check")
class AnswerCheck(Stage):
    prompts = ("answer_check",)
    settings = AnswerCheckSettings
    fields = (SUPPORT,)
    resources = {"answer_similarity": Resource(build_similarity, depends=("embedder",),
                                               doc="answer-to-text cosine similarity by the embedder")}
    reads = frozenset({"answer", "references"})
    writes = frozenset({"answer", "support"})
    needs = frozenset({"llm", "answer_similarity"})
    signals = {"answer_check.similarity": "cosine similarity of the answer and the best reference"}

    @classmethod
    def estimate(cls, config: SystemConfig, prompts: PromptLibrary) -> list[StagePlan]:
        settings = config.section("answer_check")
        shown = settings.references * config.references.chunk_chars
        return [StagePlan("answer_check", template_tokens(prompts, "answer_check") + tokens(shown),
                          settings.max_tokens, 1)]

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        settings = ctx.settings
        answered = [s for s in states if s.answer and not is_idk(s.answer) and s.references]
        similarity = ctx.resource("answer_similarity")
        prompt = ctx.prompt("answer_check")
        conversations = [prompt.render(question=s.query, answer=s.answer,
                                       references=[r.text for r in s.references[:settings.references]])
                         for s in answered]
        replies = ctx.generate(conversations, owners=answered, max_tokens=settings.max_tokens)
        for state, samples in zip(answered, replies):
            state.signals["answer_check.similarity"] = similarity(state.answer, state.references[0].text)
            supported = bool(samples) and samples[0].text.strip().lower().startswith("yes")
            state[SUPPORT] = "supported" if supported else "unsupported"
            if not supported and settings.withhold:
                state.finish(IDK, "answer_check: the references do not support the answer")
