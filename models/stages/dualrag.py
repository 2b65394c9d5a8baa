"""DualRAG (a dual-process approach to integrate reasoning and retrieval for multi-hop QA).

Each round, for every query still at it (one backend call per step for all of them):
1. the Reasoner writes one reasoning step over the knowledge outline: JSON {thought, need_retrieve};
2. when it needs more, the Entity Identifier names entities with keywords: JSON {entities: [{entity,
   keywords}]}; an entity already in the outline keeps its key;
3. each keyword is retrieved from the query's own pages ("<entity> <keyword>"), re-ranked by the entity;
4. the Knowledge Summariser reads, per entity, only the references not yet seen for that entity, and its notes
   extend the outline (the progressive knowledge outline, keyed by entity).
Up to `dualrag.max_iter` rounds; a final reasoning step after the last retrieval; then the answer prompt.
Malformed JSON is repaired, or read as "no more retrieval". When the deadline cannot afford another step, the
query answers from what it knows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from models.retrieval.local import POOL_MAY_READ, POOL_READS, LocalRetriever, Request
from models.stages.hanrag import ROUTE, ROUTE_SIGNAL, SUB_QUERIES, route_signal
from models.stages.stage import STAGES, Stage, StageContext
from models.stages.steps import finish, step
from models.state import QueryState, Signal
from utils.answers import IDK
from utils.llm_json import parse_llm_json

NOTHING_NEW = "nothing new"
STEP_COSTED_AS = "reasoning"  # one LLM step needs what budget.stage_min_s gives an answer prompt


@dataclass
class Progress:
    outline: dict[str, str] = field(default_factory=dict)
    thoughts: list[str] = field(default_factory=list)
    seen: dict[str, set[str]] = field(default_factory=dict)  # entity -> reference texts already summarised


def read_reasoning(output: str) -> tuple[str, bool]:
    """(thought, need_retrieve); unreadable output is a thought with no more retrieval."""
    data = parse_llm_json(output, dict)
    if data is None:
        return (output or "").strip()[:500], False
    return str(data.get("thought") or "").strip(), data.get("need_retrieve") is True


def link_entity(name: str, known: list[str]) -> str:
    """The outline's key for `name`: the same entity when the names match case-insensitively or one contains
    the other; else `name` itself."""
    lowered = name.lower()
    return next((key for key in known if key.lower() == lowered), None) or next(
        (key for key in known if lowered in key.lower() or key.lower() in lowered), name)


def read_entities(output: str, known: list[str], max_entities: int, max_keywords: int) -> list[tuple[str, list[str]]]:
    """(entity linked to the outline, keywords) pairs from the identifier's reply; [] when unreadable."""
    data = parse_llm_json(output, dict)
    items = data.get("entities") if data else None
    found: list[tuple[str, list[str]]] = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("entity"), str) or not item["entity"].strip():
            continue
        keywords = [k.strip() for k in item.get("keywords") or [] if isinstance(k, str) and k.strip()]
        found.append((link_entity(item["entity"].strip(), known), keywords[:max_keywords] or [""]))
    return found[:max_entities]


@dataclass
class DualRAGSettings:
    """DualRAG (strategy dualrag, or multihop: dualrag)."""

    max_iter: int = 5
    """Reason -> identify entities -> retrieve -> summarise rounds, at most."""
    top_k: int = 3
    """References retrieved per keyword."""
    max_entities: int = 3
    """Entities identified per round, at most."""
    max_keywords: int = 3
    """Keywords per entity, at most."""
    max_tokens: int = 128
    """Reply tokens of the reasoner and of the entity identifier."""
    summary_max_tokens: int = 96
    """Reply tokens of a knowledge summary."""
    answer_max_tokens: int = 96
    """Reply tokens of the final answer."""


@STAGES.register("dualrag")
class DualRAGStage(Stage):
    prompts = ("dualrag_reason", "dualrag_entities", "dualrag_summarise", "dualrag_answer")
    settings = DualRAGSettings
    reads = POOL_READS
    may_read = POOL_MAY_READ
    writes = frozenset({"route", "sub_queries", "steps", "answer"})
    needs = frozenset({"llm", "embedder"})
    signals = ROUTE_SIGNAL

    @classmethod
    def outcome(cls, state: QueryState) -> dict[str, Signal]:
        return route_signal(state)

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        self.answer(states, ctx)

    def answer(self, states: list[QueryState], ctx: StageContext) -> None:
        """Reason, retrieve and answer for every state (the hybrid strategy's hand-off calls this too)."""
        settings = ctx.section("dualrag")
        retriever = LocalRetriever(ctx.resource("embedder"))
        progress = {id(s): Progress() for s in states}
        active, retrieved = list(states), list[QueryState]()
        for state in states:
            state[ROUTE] = state[ROUTE] or "dualrag"
        for _ in range(settings.max_iter):
            if not active or not ctx.can_step(STEP_COSTED_AS, active):
                break
            needing = self._reason(active, progress, ctx)
            if not needing or not ctx.can_step(STEP_COSTED_AS, needing):
                active = retrieved = []
                break
            active = retrieved = self._retrieve(needing, progress, ctx, retriever)
        if retrieved and ctx.can_step(STEP_COSTED_AS, retrieved):
            self._reason(retrieved, progress, ctx)  # the final reasoning step after the last retrieval
        self._answer(states, progress, ctx)

    def _reason(self, states: list[QueryState], progress: dict[int, Progress], ctx: StageContext) -> list[QueryState]:
        """One reasoning step for each state; the ones that need retrieval."""
        prompt = ctx.prompt("dualrag_reason")
        outputs = step(ctx, [prompt.render(query=s.query, query_time=s.query_time, outline=progress[id(s)].outline,
                                           thoughts=progress[id(s)].thoughts) for s in states],
                       ctx.section("dualrag").max_tokens, states)
        needing = []
        for state, output in zip(states, outputs):
            thought, need = read_reasoning(output.text)
            if thought:
                progress[id(state)].thoughts.append(thought)
            if need:
                needing.append(state)
        return needing

    def _retrieve(self, states: list[QueryState], progress: dict[int, Progress], ctx: StageContext,
                  retriever: LocalRetriever) -> list[QueryState]:
        """Entities, retrieval per keyword and summaries for each state; the states that got new notes."""
        settings = ctx.section("dualrag")
        prompt = ctx.prompt("dualrag_entities")
        outputs = step(ctx, [prompt.render(query=s.query, thought=(progress[id(s)].thoughts or [s.query])[-1],
                                           known_entities=list(progress[id(s)].outline)) for s in states],
                       settings.max_tokens, states)
        requests: list[tuple[QueryState, str, Request]] = []
        for state, output in zip(states, outputs):
            for entity, keywords in read_entities(output.text, list(progress[id(state)].outline), settings.max_entities,
                                                  settings.max_keywords):
                for keyword in keywords:
                    text = f"{entity} {keyword}".strip()
                    state[SUB_QUERIES] = [*state[SUB_QUERIES], text]
                    requests.append((state, entity, Request(state, text, entity)))
        new: dict[tuple[int, str], tuple[QueryState, str, list[str]]] = {}
        for (state, entity, _), refs in zip(requests, retriever.search([r for _, _, r in requests], settings.top_k)):
            seen = progress[id(state)].seen.setdefault(entity, set())
            _, _, texts = new.setdefault((id(state), entity), (state, entity, []))
            for ref in refs:
                if ref.text not in seen:
                    seen.add(ref.text)
                    texts.append(ref.text)
        groups = [group for group in new.values() if group[2]]
        if not groups or not ctx.can_step(STEP_COSTED_AS, [s for s, _, _ in groups]):
            return []
        summarise = ctx.prompt("dualrag_summarise")
        outputs = step(ctx, [summarise.render(query=s.query, entity=e, references=texts) for s, e, texts in groups],
                       settings.summary_max_tokens, [s for s, _, _ in groups])
        updated: dict[int, QueryState] = {}
        for (state, entity, _), output in zip(groups, outputs):
            note = " ".join(output.text.split())
            if note and NOTHING_NEW not in note.lower():
                outline = progress[id(state)].outline
                outline[entity] = f"{outline[entity]} {note}" if entity in outline else note
                updated[id(state)] = state
        return list(updated.values())

    def _answer(self, states: list[QueryState], progress: dict[int, Progress], ctx: StageContext) -> None:
        if not ctx.can_step(STEP_COSTED_AS, states):
            for state in states:
                state.finish(IDK, "dualrag: no time left for the answer")
            return
        prompt = ctx.prompt("dualrag_answer")
        outputs = step(ctx, [prompt.render(query=s.query, query_time=s.query_time, outline=progress[id(s)].outline,
                                           thoughts=progress[id(s)].thoughts) for s in states],
                       ctx.section("dualrag").answer_max_tokens, states)
        for state, output in zip(states, outputs):
            finish(state, output, "dualrag")

