"""evidence: the evidence check (the seed's section 4.7): a query with nothing to reason over answers "i don't
know"."""

from __future__ import annotations

from models.stages.stage import STAGES, Stage, StageContext
from models.state import EVIDENCE, QueryState
from utils.answers import IDK


@STAGES.register("evidence")
class EvidenceCheck(Stage):
    """Queries with no reference from the pages and no evidence of a source of its own (the KG's rows) answer
    "i don't know": there is nothing to reason over, and an answer from the model's memory alone is a guess."""

    reads = frozenset({"references"})
    may_read = frozenset({EVIDENCE})
    writes = frozenset({"answer"})

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        for state in states:
            if not state.references and not state.grounded():
                state.finish(IDK, "no usable text in the search results and no KG result")
