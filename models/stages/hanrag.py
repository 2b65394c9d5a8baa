"""HANRAG (Heuristic Accurate Noise-resistant RAG for multi-hop QA) over the same stages as the seed system.

A router ("Revelator", prompts/hanrag_router.yaml) sorts each query into one of four routes:
- straightforward: answered directly, without references (the knowledge extractor's prompt);
- single-step: ANRAG: retrieve from the query's own pages, judge each reference's relevance (all judgements
  of the batch in one call), answer from the relevant ones with the reasoning prompt;
- compound: decomposed into independent sub-questions, all answered by ANRAG together, then aggregated;
- complex: refine the next sub-question from the facts so far, answer it with ANRAG, ask whether the question
  can now be answered, and repeat up to `hanrag.max_steps`; then aggregate.
All queries of a batch advance together: each step is one backend call for every query still at it. Before a
step the deadline must afford the reasoning stage's minimum; when it does not, the query answers from what is
known. Each query's route, LLM steps and sub-questions go into its trace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from loguru import logger

from models.llm.backend import Sample
from models.retrieval.local import POOL_MAY_READ, POOL_READS, LocalRetriever, Request
from models.stages.reasoning import parse_structured, reasoning_conversation
from models.stages.stage import STAGES, Stage, StageContext
from models.stages.steps import finish, step
from models.state import QueryState, Reference, Signal, StateField
from utils.answers import IDK, INVALID
from utils.llm_json import parse_llm_json

ROUTES = ("straightforward", "single-step", "compound", "complex")
STEP_COSTED_AS = "reasoning"  # one LLM step needs what budget.stage_min_s gives an answer prompt
MULTI_HOP = ("compound", "complex")
_ROUTE_WORDS = (("straightforward", "straightforward"), ("single", "single-step"), ("compound", "compound"),
                ("complex", "complex"))


def read_route(output: str) -> str:
    """The first route named in the router's reply; single-step (retrieve and filter) when it names none."""
    lowered = (output or "").lower()
    found = [(lowered.find(word), route) for word, route in _ROUTE_WORDS if word in lowered]
    return min(found)[1] if found else "single-step"


def route(states: list[QueryState], ctx: StageContext) -> None:
    prompt = ctx.prompt("hanrag_router")
    outputs = step(ctx, [prompt.render(query=s.query, query_time=s.query_time) for s in states],
                   ctx.section("hanrag").max_tokens, states)
    for state, output in zip(states, outputs):
        state[ROUTE] = read_route(output.text)


# What the multi-hop methods add to a query, declared once here (by HANRAGStage) and written by hanrag, dualrag and
# multihop: the route taken and the sub-questions asked; and the route as a signal, read off every query of a
# strategy that names one of them.
ROUTE = StateField[str | None]("route", lambda: None, record=lambda value: value,
                               doc="the multi-hop route taken (None where no multi-hop method read the query)")
SUB_QUERIES = StateField[list[str]]("sub_queries", list, record=list,
                                    doc="the sub-questions a multi-hop method asked")
MULTI_HOP_FIELDS = (ROUTE, SUB_QUERIES)
ROUTE_SIGNAL = {"answer.route": "the multi-hop route taken (single without one)"}


def route_signal(state: QueryState) -> dict[str, Signal]:
    return {"answer.route": state[ROUTE] or "single"}


@dataclass
class HANRAGSettings:
    """HANRAG: the router's four routes (strategy hanrag, or multihop: hanrag)."""

    max_steps: int = 4
    """Complex route: refine -> answer -> "answerable?" rounds, at most."""
    max_sub_queries: int = 4
    """Compound route: sub-questions of a decomposition, at most."""
    top_k: int = 5
    """References retrieved per (sub-)question before the relevance filter."""
    max_tokens: int = 96
    """Reply tokens of the router, decomposer, refiner, checker and relevance filter."""
    answer_max_tokens: int = 96
    """Reply tokens of an answer (a sub-question's or the final one)."""


@STAGES.register("hanrag")
class HANRAGStage(Stage):
    prompts = ("hanrag_router", "hanrag_relevance", "hanrag_decompose", "hanrag_refine", "hanrag_check",
               "hanrag_aggregate", "knowledge", "reasoning")
    settings = HANRAGSettings
    fields = MULTI_HOP_FIELDS
    signals = ROUTE_SIGNAL
    sections = ("reasoning",)
    reads = POOL_READS
    may_read = POOL_MAY_READ
    writes = frozenset({"route", "sub_queries", "steps", "answer"})
    needs = frozenset({"llm", "embedder"})

    @classmethod
    def outcome(cls, state: QueryState) -> dict[str, Signal]:
        return route_signal(state)

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        route(states, ctx)
        self.answer(states, ctx)

    def answer(self, states: list[QueryState], ctx: StageContext) -> None:
        """Answer routed queries, each by its route."""
        retriever = LocalRetriever(ctx.resource("embedder"))
        by_route = {r: [s for s in states if s[ROUTE] == r] for r in ROUTES}
        self._straightforward(by_route["straightforward"], ctx)
        self._single_step(by_route["single-step"], ctx, retriever)
        self._compound(by_route["compound"], ctx, retriever)
        self._complex(by_route["complex"], ctx, retriever)

    def _straightforward(self, states: list[QueryState], ctx: StageContext) -> None:
        if not states or not ctx.can_step(STEP_COSTED_AS, states):
            return
        prompt = ctx.prompt("knowledge")
        outputs = step(ctx, [prompt.render(query=s.query, query_time=s.query_time) for s in states],
                       ctx.section("hanrag").answer_max_tokens, states)
        for state, output in zip(states, outputs):
            finish(state, output, "hanrag straightforward")

    def _single_step(self, states: list[QueryState], ctx: StageContext, retriever: LocalRetriever) -> None:
        for state, (_, output) in zip(states, self.anrag([(s, s.query) for s in states], ctx, retriever)):
            if output is None:
                state.finish(IDK, "hanrag single-step: no relevant reference, or no time left")
            else:
                finish(state, output, "hanrag single-step")

    def _compound(self, states: list[QueryState], ctx: StageContext, retriever: LocalRetriever) -> None:
        if not states or not ctx.can_step(STEP_COSTED_AS, states):
            return
        settings = ctx.section("hanrag")
        prompt = ctx.prompt("hanrag_decompose")
        outputs = step(ctx, [prompt.render(query=s.query, query_time=s.query_time,
                                           max_sub_queries=settings.max_sub_queries) for s in states],
                       settings.max_tokens, states)
        for state, output in zip(states, outputs):
            subs = [q.strip() for q in parse_llm_json(output.text, list) or [] if isinstance(q, str) and q.strip()]
            state[SUB_QUERIES] = subs[:settings.max_sub_queries] or [state.query]
        items = [(s, q) for s in states for q in s[SUB_QUERIES]]
        facts: dict[int, list[dict[str, str]]] = {id(s): [] for s in states}
        for (state, question), (answer, _) in zip(items, self.anrag(items, ctx, retriever)):
            facts[id(state)].append({"question": question, "answer": answer or IDK})
        self._aggregate(states, facts, ctx, "hanrag compound")

    def _complex(self, states: list[QueryState], ctx: StageContext, retriever: LocalRetriever) -> None:
        settings = ctx.section("hanrag")
        facts: dict[int, list[dict[str, str]]] = {id(s): [] for s in states}
        active = list(states)
        for _ in range(settings.max_steps):
            if not active or not ctx.can_step(STEP_COSTED_AS, active):
                break
            refine = ctx.prompt("hanrag_refine")
            outputs = step(ctx, [refine.render(query=s.query, query_time=s.query_time, facts=facts[id(s)])
                                 for s in active], settings.max_tokens, active)
            asked = []
            for state, output in zip(active, outputs):
                question = next_question(output.text)
                if question and question not in state[SUB_QUERIES]:
                    state[SUB_QUERIES] = [*state[SUB_QUERIES], question]
                    asked.append((state, question))
            if not asked:
                break  # the refiner has nothing new to ask
            for (state, question), (answer, _) in zip(asked, self.anrag(asked, ctx, retriever)):
                facts[id(state)].append({"question": question, "answer": answer or IDK})
            active = [state for state, _ in asked]
            if not ctx.can_step(STEP_COSTED_AS, active):
                break
            check = ctx.prompt("hanrag_check")
            outputs = step(ctx, [check.render(query=s.query, facts=facts[id(s)]) for s in active],
                           settings.max_tokens, active)
            # malformed JSON reads as "answerable": no more retrieval for that query
            active = [s for s, out in zip(active, outputs)
                      if (parse_llm_json(out.text, dict) or {}).get("answerable") is False]
        self._aggregate(states, facts, ctx, "hanrag complex")

    def _aggregate(self, states: list[QueryState], facts: dict[int, list[dict[str, str]]], ctx: StageContext,
                   how: str) -> None:
        known = [s for s in states if any(f["answer"] != IDK for f in facts[id(s)])]
        answered = {id(s) for s in known}
        for state in states:
            if id(state) not in answered:
                state.finish(IDK, f"{how}: no sub-question answered")
        if not known:
            return
        if not ctx.can_step(STEP_COSTED_AS, known):
            for state in known:
                state.finish(IDK, f"{how}: no time left to aggregate")
            return
        prompt = ctx.prompt("hanrag_aggregate")
        outputs = step(ctx, [prompt.render(query=s.query, query_time=s.query_time, facts=facts[id(s)])
                             for s in known], ctx.section("hanrag").answer_max_tokens, known)
        for state, output in zip(known, outputs):
            finish(state, output, how)

    @staticmethod
    def anrag(items: list[tuple[QueryState, str]], ctx: StageContext, retriever: LocalRetriever
              ) -> list[tuple[str | None, Sample | None]]:
        """ANRAG for (query, question) pairs: (the short answer or None, the raw answer output or None), in order.
        A question with no relevant reference gets (None, None) without an answer call."""
        settings = ctx.section("hanrag")
        if not items or not ctx.can_step(STEP_COSTED_AS, [s for s, _ in items]):
            return [(None, None)] * len(items)
        hits = retriever.search([Request(s, q) for s, q in items], settings.top_k)
        pairs = [(i, ref) for i, refs in enumerate(hits) for ref in refs]
        judge = ctx.prompt("hanrag_relevance")
        verdicts = step(ctx, [judge.render(question=items[i][1], reference=ref.text[:1500]) for i, ref in pairs],
                        8, [s for s, _ in items], owners=[items[i][0] for i, _ in pairs])
        relevant: dict[int, list[Reference]] = {}
        for (i, ref), verdict in zip(pairs, verdicts):
            if re.match(r"\W*yes\b", verdict.text.lower()):
                relevant.setdefault(i, []).append(ref)
        answerable = [i for i in range(len(items)) if relevant.get(i)]
        results: list[tuple[str | None, Sample | None]] = [(None, None)] * len(items)
        if not answerable or not ctx.can_step(STEP_COSTED_AS, [items[i][0] for i in answerable]):
            return results
        prompt = ctx.prompt("reasoning")
        conversations = [reasoning_conversation(prompt, sub_state(items[i][0], items[i][1], relevant[i]),
                                                ctx.section("reasoning").max_reference_chars) for i in answerable]
        outputs = step(ctx, conversations, settings.answer_max_tokens, [items[i][0] for i in answerable])
        for i, output in zip(answerable, outputs):
            parsed = parse_structured(output.text)
            results[i] = (None if parsed is None else INVALID if parsed.false_premise else parsed.answer, output)
        logger.debug("ANRAG: {} questions, {} with relevant references", len(items), len(answerable))
        return results


def next_question(output: str) -> str | None:
    """The refiner's next question: {"question": ...}, or a bare line ending in "?"."""
    data = parse_llm_json(output, dict)
    if data and isinstance(data.get("question"), str) and data["question"].strip():
        return data["question"].strip()
    line = next((line.strip() for line in (output or "").splitlines() if line.strip().endswith("?")), None)
    return line


def sub_state(state: QueryState, question: str, references: list[Reference]) -> QueryState:
    """A stand-in query for the reasoning prompt: the sub-question, with the references judged relevant."""
    return QueryState(state.index, state.interaction_id, question, state.query_time, [], references=references)

