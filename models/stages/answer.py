"""The answer step every query leaves by (the seed's section 4.7 corner cases: the canonical "i don't know" and
"invalid question", one line within the grader's tokens), and the signals read off the finished query: its own and
those of every stage the strategy names (`Stage.outcome`). The pre-check and the evidence check are
models/stages/precheck.py and evidence.py."""

from __future__ import annotations

import re
from collections.abc import Sequence

from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

from models.stages.stage import Stage, StageContext
from models.state import EVIDENCE, QueryState, Signal, guarded
from utils.answers import final_answer, is_idk, is_invalid, normalize_text
from utils.grader_tokens import grader_token_count

_WORD = re.compile(r"[a-z0-9]+")
_NUMBER = re.compile(r"[-+$€£]?\d[\d,]*(?:\.\d+)?\s*(?:%|percent|million|billion|thousand)?")


class AnswerStage(Stage):
    """Canonical "i don't know" / "invalid question", one line, within the grader's 75 Llama-2 tokens. CragSystem
    runs it after every strategy, on every query; it is not a name a strategy lists."""

    name = "answer"
    may_read = frozenset({"references", "domain", "dynamism", EVIDENCE})
    writes = frozenset({"answer"})
    signals = {
        "references.count": "how many references the query kept",
        "references.best": "the best reference's score (None without references)",
        "references.top3_mean": "the mean score of the best three references",
        "attributes.domain": "the predicted domain", "attributes.dynamism": "the predicted dynamism",
        "answer.grader_tokens": "the answer's length in the grader's tokens",
        "answer.number": "whether the answer is a number", "answer.yes_no": "whether the answer is yes or no",
        "answer.invalid": "whether the answer is \"invalid question\"",
        "answer.support_best": "the share of the answer's content words in the best reference",
        "answer.support_any": "the share of the answer's content words in any reference or line of evidence",
    }

    def __init__(self, strategy: Sequence[type[Stage]] = ()) -> None:
        """`strategy`: the stages the strategy names, switched on or not, whose `outcome` signals it adds."""
        self.strategy = [cls for cls in strategy if cls.signals]

    def declared_signals(self) -> set[str]:
        """Its own signals and those of the strategy's stages, which their `outcome` gives."""
        return set(self.signals).union(*(cls.signals for cls in self.strategy))

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        for state in states:
            if state.answer is None and not state.done_reason:
                skipped = [r.stage for r in state.trace if r.status == "skipped"]
                state.done_reason = f"no answer (skipped: {', '.join(skipped) or 'none'})"
            state.answer, change = final_answer(state.answer)
            if change:
                state.done_reason = f"{state.done_reason}; {change}" if state.done_reason else change
            state.done = True
            state.signals.update(outcome_signals(state))
            for cls in self.strategy:
                with guarded(cls.ports(), [state]):  # a stage's outcome reads what that stage declares
                    state.signals.update(cls.outcome(state))


def outcome_signals(state: QueryState) -> dict[str, Signal]:
    """The signals any strategy leaves on a query, read off its state once it has an answer: the references' scores
    (best first), the predicted attributes and the answer's form."""
    scores = sorted((r.score for r in state.references), reverse=True)
    answer = normalize_text(state.answer or "")
    return {"references.count": len(scores), "references.best": scores[0] if scores else None,
            "references.top3_mean": sum(scores[:3]) / len(scores[:3]) if scores else None,
            "attributes.domain": state.domain, "attributes.dynamism": state.dynamism,
            "answer.grader_tokens": grader_token_count(state.answer or ""),
            "answer.number": bool(_NUMBER.fullmatch(answer)), "answer.yes_no": answer in ("yes", "no"),
            "answer.invalid": is_invalid(answer),
            **support_signals(state)}


def support_signals(state: QueryState) -> dict[str, Signal]:
    """How much of the answer the evidence says: the share of its content words (stop words left out) found in the
    best reference (`answer.support_best`), and in any reference or line of evidence that is a source of its own
    (`Evidence.grounds`: the KG's rows; `answer.support_any`). A small
    model's right answers are copied from what it read; its wrong ones often are not. None without content words
    (an "i don't know", a bare yes or no)."""
    words = set(_WORD.findall((state.answer or "").lower())) - ENGLISH_STOP_WORDS
    if not words or is_idk(state.answer or ""):
        return {"answer.support_best": None, "answer.support_any": None}
    best = max(state.references, key=lambda r: r.score, default=None)
    found_best = set(_WORD.findall(best.text.lower())) if best else set()
    found_any = found_best.union(*(_WORD.findall(text.lower()) for text in
                                   [r.text for r in state.references if r is not best]
                                   + [str(line) for block in state.grounding_blocks() for line in block.lines]))
    return {"answer.support_best": len(words & found_best) / len(words),
            "answer.support_any": len(words & found_any) / len(words)}
