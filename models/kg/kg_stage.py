"""kg: the KG module (section 4.5 of the seed paper) over the CRAG mock API, for tasks 2 and 3.

Rules path (`kg.method: rules`): one LLM call for the batch extracts each query's domain and entities as JSON
(repaired, or dropped when it cannot be read); domain rules choose the API calls. Functions path
(`kg.method: functions`): the LLM lists the calls itself; each is checked against the endpoint table (name,
argument names and types) before anything is sent, and at most `kg.max_calls` are made. Spans path (`kg.method:
spans`): no LLM call; the question's word spans are tried as the predicted domain's names (models/kg/rules.py
`span_lookup`).

Names: the LLM writes names as the question does ("meta", "manchester united"), and the organisers' API matches
most names exactly, case included. So on both paths every name is resolved through the server's own searches
(company, artist, song, open entity; movies and people come back from their BM25 search) and the best match by
name similarity is kept (utils/names.py); a name that matches nothing is left out, never looked up raw, so an
unknown artist never comes back as "0 grammys". Teams have no search: the games of the date are fetched and
filtered by team here, with a small alias table for the organisers' spellings.

Results: the calls of the batch run concurrently within the stage's deadline; each result becomes rows (one
attribute, award, game or day: models/kg/rows.py); a query's rows are ranked by relevance to its
question (shared words, named dates, and meaning: the batch's questions and rows are embedded in one call by the
system's embedder) and whole rows are kept within `kg.max_chars`; they reach the calculator and reasoning prompts as
knowledge-graph results.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from loguru import logger

from models.config import DOMAINS, SystemConfig
from models.estimates import StagePlan, template_tokens
from models.kg import rows as rows_
from models.kg.client import ENDPOINTS, KGClient
from models.kg.rules import Lookup, function_lookup, query_date, read_calls, read_entities, rule_lookup, span_lookup
from models.kg.settings import KGSettings
from models.prompting import PromptLibrary
from models.resources import Resource
from models.stages.stage import STAGES, Stage, StageContext
from models.state import Evidence, QueryState, Signal, StateField
from utils.time_budget import Deadline


def build_client(config: SystemConfig, prompts: PromptLibrary, built: dict[str, Any]) -> KGClient | None:
    """A client whose server answered at start-up (one probe, logged), else None: the pipeline then has no kg stage,
    so no call of the run goes to a server that is not there."""
    client = KGClient.from_config(config.section("kg", KGSettings))
    return client if client.probe() else None


def similarities(embedder: Any, lookups: list[tuple[QueryState, Lookup]], deadline: Deadline) -> list[list[float]]:
    """Per lookup, the cosine of its question and each of its rows, from one embedding call for the batch. Rows
    the embedder did not reach before the deadline get none (ranked on words and dates alone)."""
    texts = [state.query for state, _ in lookups] + [row.text for _, kg in lookups for row in kg.rows]
    if len(texts) == len(lookups):  # no rows to rank
        return [[] for _ in lookups]
    try:
        vectors = embedder.encode(texts, deadline=deadline)
    except Exception as err:  # the rows are worth more ranked on words than lost with the stage
        logger.opt(exception=err).warning("KG rows: embedding failed ({}); ranked on words and dates", err)
        return [[] for _ in lookups]
    if len(vectors) < len(texts):
        logger.info("KG rows: {} of {} texts embedded before the deadline; the rest ranked on words and dates",
                    len(vectors), len(texts))
    if len(vectors) < len(lookups):  # not even the questions
        return [[] for _ in lookups]
    found, start = [], len(lookups)
    for number, (_, kg) in enumerate(lookups):
        rows = vectors[start:start + len(kg.rows)]
        found.append([float(x) for x in rows @ vectors[number]])
        start += len(kg.rows)
    return found


# Both prompts frame the query as "Question: ..."; a small model writes its reply and then a made-up next
# question with its own reply, which costs the batch's time and which the JSON reader never keeps.
NEXT_QUESTION = "\nQuestion:"

KG_RESULTS = StateField[list[str]](
    "kg_results", list, record=list, evidence=Evidence("Knowledge graph", "kg", grounds=True),
    doc="the KG's results, one rendered row per line, best first")
KG_CALLS = StateField[list[dict[str, Any]]](
    "kg_calls", list, record=list, doc='{"call", "args", "answered"} of each KG call, in order made')


@STAGES.register("kg")
class KGStage(Stage):
    """Tasks 2 and 3; CragSystem leaves it out when no KG server answered at start-up."""

    prompts = ("kg_entities", "kg_functions")
    settings = KGSettings
    fields = (KG_RESULTS, KG_CALLS)
    resources = {"kg": Resource(build_client, doc="the KG client (None when no server answered)", drops=True,
                                 sections=("kg",))}
    may_read = frozenset({"domain"})  # the rules path's entity prompt names the predicted domain where there is one
    writes = frozenset({"kg_results", "kg_calls"})
    needs = frozenset({"llm", "kg", "embedder"})
    signals = {"kg.calls": "how many KG calls the query made", "kg.answered": "how many KG calls answered",
               "kg.lines": "how many KG result lines the query kept"}

    @classmethod
    def evidence_chars(cls, config: SystemConfig) -> int:
        return config.section("kg", KGSettings).max_chars

    @classmethod
    def estimate(cls, config: SystemConfig, prompts: PromptLibrary) -> list[StagePlan]:
        settings = config.section("kg", KGSettings)
        if settings.method == "spans":
            return []
        functions = settings.method == "functions"
        extra = len(ENDPOINTS) * 25 if functions else 0  # the endpoint list, a line of about 25 tokens each
        return [StagePlan("kg", template_tokens(prompts, "kg_functions" if functions else "kg_entities") + extra,
                          settings.max_tokens, 1)]

    @classmethod
    def outcome(cls, state: QueryState) -> dict[str, Signal]:
        calls = state[KG_CALLS]
        return {"kg.calls": len(calls), "kg.answered": sum(bool(c.get("answered")) for c in calls),
                "kg.lines": len(state[KG_RESULTS])}

    @classmethod
    def active(cls, config: SystemConfig) -> bool:
        return config.task > 1

    @staticmethod
    def extract(states: list[QueryState], ctx: StageContext) -> list[str]:
        """Each query's LLM reply: its entities (rules) or its calls (functions); "" for each on the spans path,
        which asks the LLM nothing."""
        settings = ctx.settings
        if settings.method == "spans":
            return ["" for _ in states]
        if settings.method == "functions":
            prompt = ctx.prompt("kg_functions")
            functions = [f"{e.signature()}: {e.doc}" for e in ENDPOINTS.values()]
            conversations = [prompt.render(query=s.query, query_time=s.query_time, functions=functions,
                                           max_calls=settings.max_calls) for s in states]
        else:
            prompt = ctx.prompt("kg_entities")
            conversations = [prompt.render(query=s.query, query_time=s.query_time, domain=s.domain) for s in states]
        outputs = ctx.generate(conversations, owners=states, max_tokens=settings.max_tokens, stop=[NEXT_QUESTION])
        return [samples[0].text if samples else "" for samples in outputs]

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        client = ctx.resource("kg")
        if client is None:
            raise RuntimeError("kg stage without a KG client (task 1 never calls the KG)")
        settings = ctx.settings
        work = ctx.work_deadline()
        jobs: list[tuple[QueryState, Lookup, Callable[[], Any]]] = []
        for state, output in zip(states, self.extract(states, ctx)):
            today = query_date(state.query_time)
            kg = Lookup(client, work, today, settings, state.query, rows_.named_dates(state.query, today))
            if settings.method == "spans":
                domain = state.domain if state.domain in DOMAINS else "open"
                jobs.append((state, kg, functools.partial(span_lookup, kg, domain, today, settings.max_spans)))
            elif settings.method == "functions":
                calls, refused = read_calls(output, settings.max_calls)
                if refused:
                    logger.info("{}: KG calls refused before sending: {}", state.interaction_id, refused)
                jobs.append((state, kg, functools.partial(function_lookup, kg, calls)))
            elif (read := read_entities(output, state.domain, state.query)) is None:
                logger.info("{}: KG entity extraction unreadable; no KG lookup", state.interaction_id)
            else:
                domain, entities = read
                jobs.append((state, kg, functools.partial(rule_lookup, kg, domain, entities, today)))
        with ThreadPoolExecutor(max_workers=max(1, settings.concurrency)) as pool:
            futures = [pool.submit(job) for _, _, job in jobs]
        for (state, _, _), future in zip(jobs, futures):
            if error := future.exception():  # one query's lookup bug leaves the others their results
                logger.opt(exception=error).error("{}: KG lookup failed: {}", state.interaction_id, error)
        lookups = [(state, kg) for state, kg, _ in jobs]
        ctx.cut([state for state, kg in lookups if kg.cut], "KG calls left unsent")
        for (state, kg), similarity in zip(lookups, similarities(ctx.resource("embedder"), lookups, work)):
            ranked = rows_.rank(kg.rows, state.query, kg.dates, similarity)
            state[KG_RESULTS] = rows_.fit(ranked, settings.max_chars)
            state[KG_CALLS] = kg.made
            logger.debug("{}: {} KG calls, {} of {} rows kept", state.interaction_id, kg.calls,
                         len(state[KG_RESULTS]), len(kg.rows))
