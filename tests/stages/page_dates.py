"""The page dates: a stage from outside the project whose evidence reaches the answer prompt, in one file, for
tests/unit/test_stage_file.py and docs/how-to/add-a-stage.md. Everything it adds is declared here: its settings (the
config section `page_dates`), a QueryState field that is evidence (its block reaches every answer prompt that lists
evidence, the reasoning prompt among them), and a gate signal. A config loads it by naming this module in
`stage_modules` and its name in a strategy, before the answer's stage.

It tells the LLM when each of the query's pages was last changed, which a question about "now" needs: the newest
first, at most `max_dates`.
"""

from __future__ import annotations

from dataclasses import dataclass

from models.stages import STAGES, Stage, StageContext
from models.state import Evidence, QueryState, Signal, StateField


@dataclass
class PageDatesSettings:
    """The page dates: when each of a query's pages was last changed, as evidence for the answer."""

    max_dates: int = 3
    """How many pages' dates the answer prompt is shown, the newest first."""


LINE_CHARS = 120  # a page name and a date: about this long at most (an assumption)
PAGE_DATES = StateField[list[str]](
    "page_dates", list, record=list, evidence=Evidence("When the pages were last updated", "dates"),
    doc='"page name: date" of the pages with a last-modified date, the newest first')


@STAGES.register("page_dates")
class PageDates(Stage):
    settings = PageDatesSettings
    fields = (PAGE_DATES,)
    writes = frozenset({"page_dates"})
    signals = {"page_dates.count": "how many of the query's pages carry a last-modified date"}

    @classmethod
    def evidence_chars(cls, config) -> int:
        """What its block can add to an answer prompt, for the budget planner: a "page name: date" line per date."""
        return config.section("page_dates", PageDatesSettings).max_dates * LINE_CHARS

    @classmethod
    def outcome(cls, state: QueryState) -> dict[str, Signal]:
        return {"page_dates.count": len(state[PAGE_DATES])}

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        for state in states:
            dated = [(str(page.get("page_last_modified") or "").strip(), str(page.get("page_name") or "").strip())
                     for page in state.pages]
            newest = sorted((pair for pair in dated if pair[0]), reverse=True)[:ctx.settings.max_dates]
            state[PAGE_DATES] = [f"{name}: {date}" for date, name in newest]
