"""HANRAG and DualRAG with a scripted LLM: each route, the iteration limits, JSON repair, the deadline cut-off."""

import json
import re

import pytest

from models.kg.kg_stage import KG_RESULTS
from models.retrieval.local import LocalRetriever, Request
from models.stages.dualrag import link_entity, read_entities, read_reasoning
from models.stages.hanrag import SUB_QUERIES, read_route
from models.stages.stage import run_stage
from models.state import QueryState, Reference
from tests.conftest import stage_of, to_batch
from tests.fakes import HashEmbedder, ScriptedLLM, by_prompt, prompt_name
from utils.time_budget import Deadline

LENNON = "who was born first, john lennon or paul mccartney?"


def block(answer: str) -> str:
    return f"===START===\n## Answer: {answer}\n## False Premise: no\n===END==="


def question_of(conversation) -> str:
    return re.search(r"Question: (.*)", conversation[1]["content"]).group(1).strip()


def calls_of(llm, name):
    return [c for conversations, _ in llm.calls for c in conversations if prompt_name(c) == name]


def system_for(make_system, cpu_config, strategy, llm, **settings):
    cpu_config.strategy = strategy
    for key, value in settings.items():
        section, field = key.split("__")
        setattr(cpu_config.section(section), field, value)
    return make_system(llm)


def example(sample_examples, query):
    return next(e for e in sample_examples if e["query"] == query)


@pytest.mark.parametrize("output, route", [
    ("compound", "compound"), ("Route: Complex.", "complex"), ("single-step", "single-step"),
    ("Single step lookup", "single-step"), ("STRAIGHTFORWARD", "straightforward"),
    ("it is complex, not compound", "complex"),  # the first one named
    ("I am not sure", "single-step"), ("", "single-step"),
])
def test_router_reply(output, route):
    assert read_route(output) == route


def born(conversation) -> str:
    """The sub-question answerer: reads a birth date for the person asked about from its references."""
    user = conversation[1]["content"]
    person = "lennon" if "lennon" in question_of(conversation).lower() else "mccartney"
    match = re.search(rf"{person}[^.]*?born[^.]*?(\d{{1,2}} \w+ \d{{4}}|\w+ \d{{1,2}}, \d{{4}})", user, re.I)
    return block(match.group(1) if match else "i don't know")


def test_a_compound_question_of_data_is_answered_through_decomposition(make_system, cpu_config, sample_examples):
    def aggregate(conversation):
        facts = conversation[1]["content"]
        return block("john lennon" if "1940" in facts and "1942" in facts else "i don't know")

    llm = ScriptedLLM(by_prompt(
        hanrag_router="compound",
        hanrag_decompose="['when was john lennon born?', 'when was paul mccartney born?',]",  # repaired
        hanrag_relevance=lambda c: "yes" if re.search(r"lennon|mccartney", c[1]["content"].split("Reference:")[1],
                                                      re.I) else "no",
        reasoning=born, hanrag_aggregate=aggregate))
    system = system_for(make_system, cpu_config, "hanrag", llm)
    result = system.answer_batch(to_batch([example(sample_examples, LENNON)]))
    assert result.answers == ["john lennon"]
    (trace,) = result.trace
    assert trace["route"] == "compound"
    assert trace["sub_queries"] == ["when was john lennon born?", "when was paul mccartney born?"]
    assert trace["steps"] == 5  # router, decomposer, relevance (one call), sub-answers (one call), aggregator
    assert len(calls_of(llm, "reasoning")) == 2 and len(calls_of(llm, "hanrag_aggregate")) == 1
    assert len(llm.calls) == 5  # each step one backend call
    facts = calls_of(llm, "hanrag_aggregate")[0][1]["content"]
    assert "when was john lennon born? 9 October 1940" in facts


def test_each_route_in_one_batch(make_system, cpu_config, sample_examples):
    routes = {"who directed the movie inception?": "single-step",
              "what are the three primary colors of the traditional ryb color model?": "straightforward",
              LENNON: "compound",
              "who was the president of france when the eiffel tower was completed?": "complex"}
    checks = iter(['{"answerable": false}', '{"answerable": true}'])
    llm = ScriptedLLM(by_prompt(
        hanrag_router=lambda c: routes[question_of(c)],
        knowledge=block("red, yellow and blue"),
        hanrag_relevance="yes",
        reasoning=lambda c: block("answer to " + question_of(c)),
        hanrag_decompose='["a?", "b?"]',
        hanrag_refine=lambda c: json.dumps({"question": f"step {c[1]['content'].count('- ') + 1}?"}),
        hanrag_check=lambda c: next(checks),
        hanrag_aggregate=lambda c: block(f"aggregated {c[1]['content'].count('- ')} facts")))
    system = system_for(make_system, cpu_config, "hanrag", llm)
    batch = [example(sample_examples, q) for q in routes]
    result = system.answer_batch(to_batch(batch))
    answers = dict(zip(routes, result.answers))
    assert answers["who directed the movie inception?"] == "answer to who directed the movie inception?"
    assert answers["what are the three primary colors of the traditional ryb color model?"] == "red, yellow and blue"
    assert answers[LENNON] == "aggregated 2 facts"
    assert answers["who was the president of france when the eiffel tower was completed?"] == "aggregated 2 facts"
    traces = {t["interaction_id"]: t for t in result.trace}
    assert {traces[e["interaction_id"]]["route"] for e in batch} == set(routes.values())
    complex_trace = traces[batch[3]["interaction_id"]]
    assert complex_trace["sub_queries"] == ["step 1?", "step 2?"]  # the checker said yes after the second
    assert len(calls_of(llm, "hanrag_router")) == 4 and len(llm.calls[0][0]) == 4  # one router call for all
    assert len(calls_of(llm, "knowledge")) == 1


def test_the_complex_route_stops_at_max_steps(make_system, cpu_config, sample_examples):
    llm = ScriptedLLM(by_prompt(
        hanrag_router="complex", hanrag_relevance="yes", reasoning=block("x"),
        hanrag_refine=lambda c: f"What is step {len(calls_of(llm, 'hanrag_refine'))}?",  # no JSON: a bare question
        hanrag_check="{'answerable': False}", hanrag_aggregate=block("done")))
    system = system_for(make_system, cpu_config, "hanrag", llm, hanrag__max_steps=3)
    result = system.answer_batch(to_batch(sample_examples[4:5]))
    assert result.answers == ["done"]
    (trace,) = result.trace
    assert len(trace["sub_queries"]) == 3 and len(calls_of(llm, "hanrag_refine")) == 3
    assert trace["steps"] == 1 + 3 * 4 + 1  # router; refine, relevance, answer, check per step; aggregate


def test_malformed_checker_json_reads_as_no_more_retrieval(make_system, cpu_config, sample_examples):
    llm = ScriptedLLM(by_prompt(hanrag_router="complex", hanrag_relevance="yes", reasoning=block("x"),
                                hanrag_refine='{"question": "first?"}', hanrag_check="maybe, who knows",
                                hanrag_aggregate=block("done")))
    system = system_for(make_system, cpu_config, "hanrag", llm)
    assert system.batch_generate_answer(to_batch(sample_examples[4:5])) == ["done"]
    assert len(calls_of(llm, "hanrag_refine")) == 1


def test_no_relevant_reference_means_i_dont_know_without_an_answer_call(make_system, cpu_config, sample_examples):
    llm = ScriptedLLM(by_prompt(hanrag_router="single-step", hanrag_relevance="No."))
    system = system_for(make_system, cpu_config, "hanrag", llm)
    result = system.answer_batch(to_batch(sample_examples[:1]))
    assert result.answers == ["i don't know"]
    assert not calls_of(llm, "reasoning") and "no relevant reference" in result.trace[0]["reason"]


class TickingClock:
    """A clock the scripted LLM moves 10 s forward for every conversation it answers."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_deadline_cuts_the_loop_and_answers_with_what_is_known(make_system, cpu_config, sample_examples):
    clock = TickingClock()

    def ticking(reply):
        def answer(conversation):
            clock.now += 10.0
            return reply(conversation) if callable(reply) else reply
        return answer

    llm = ScriptedLLM(by_prompt(
        hanrag_router=ticking("complex"), hanrag_relevance=ticking("yes"), reasoning=ticking(block("1889")),
        hanrag_refine=ticking(lambda c: json.dumps({"question": f"q{len(calls_of(llm, 'hanrag_refine'))}?"})),
        hanrag_check=ticking('{"answerable": false}'), hanrag_aggregate=ticking(block("sadi carnot"))))
    cpu_config.budget.stage_min_s["reasoning"] = 1.0
    system = system_for(make_system, cpu_config, "hanrag", llm, hanrag__max_steps=10)
    states = [QueryState(0, "q0", sample_examples[4]["query"], sample_examples[4]["query_time"],
                         sample_examples[4]["search_results"])]
    batch = system.batch(1)
    batch.deadline = Deadline(75.0, clock=clock)  # room for the router and about one refine-answer-check round
    run_stage(stage_of(system, "references"), states, batch)
    run_stage(stage_of(system, "hanrag"), states, batch)
    state = states[0]
    assert state[SUB_QUERIES] == ["q1?"]  # one round of the ten allowed fit
    assert state.done and state.answer == "i don't know" and "no time left" in state.done_reason
    assert not calls_of(llm, "hanrag_aggregate")  # nothing started after the deadline
    assert state.deadline_cuts == ["hanrag: no time for a step"]


# --- the shared retriever ---

def test_local_retriever_searches_each_querys_own_pool_with_kg_lines():
    embedder = HashEmbedder()
    a = QueryState(0, "a", "q", "", [])
    a.candidates = [Reference("lennon was born in liverpool", "chunk"), Reference("paris is in france", "chunk")]
    a.candidate_vectors = embedder.encode([r.text for r in a.candidates])
    a[KG_RESULTS] = ["music_get_artist_birth_date(artist_name='John Lennon'): 1940-10-09"]
    b = QueryState(1, "b", "q", "", [])
    retriever = LocalRetriever(embedder)
    hits = retriever.search([Request(a, "where was lennon born"), Request(b, "anything"),
                             Request(a, "birth date", entity="john lennon")], k=1)
    assert [r.text for r in hits[0]] == ["lennon was born in liverpool"]
    assert hits[1] == []  # a query with nothing retrieved has nothing to search
    assert hits[2][0].kind == "kg"  # the entity re-ranks towards its KG line
    calls = embedder.calls
    retriever.search([Request(a, "liverpool")], k=2)
    assert embedder.calls == calls + 1  # the KG lines were embedded once, then cached


# --- DualRAG ---

@pytest.mark.parametrize("output, expected", [
    ('{"thought": "I need Lennon\'s birth date", "need_retrieve": true}', ("I need Lennon's birth date", True)),
    ("{'thought': 'enough', 'need_retrieve': False,}", ("enough", False)),
    ("I think we are done", ("I think we are done", False)),  # unreadable: no more retrieval
])
def test_reasoner_reply(output, expected):
    assert read_reasoning(output) == expected


def test_entities_link_to_the_outline():
    known = ["John Lennon", "The Beatles"]
    assert link_entity("john lennon", known) == "John Lennon"
    assert link_entity("Beatles", known) == "The Beatles"
    assert link_entity("Ringo Starr", known) == "Ringo Starr"
    output = ('{"entities": [{"entity": "lennon", "keywords": ["birth", "death", "wife", "sons"]}, '
              '{"entity": "", "keywords": ["x"]}, {"entity": "Paul", "keywords": []}, "junk"]}')
    assert read_entities(output, known, 3, 2) == [("John Lennon", ["birth", "death"]), ("Paul", [""])]
    assert read_entities("no json", known, 3, 2) == []


def dualrag_llm(rounds: int, **overrides):
    """A reasoner that asks for retrieval `rounds` times; an identifier naming the two Beatles of the question."""
    state = {"reasons": 0}

    def reason(conversation):
        state["reasons"] += 1
        return json.dumps({"thought": f"step {state['reasons']}", "need_retrieve": state["reasons"] <= rounds})

    def summarise(conversation):
        refs = conversation[1]["content"].split("References:")[1]
        dates = re.findall(r"\b(19\d\d)\b", refs)
        return f"born in {dates[0]}" if dates else "nothing new"

    replies = dict(dualrag_reason=reason, dualrag_summarise=summarise,
                   dualrag_entities='{"entities": [{"entity": "John Lennon", "keywords": ["born"]}, '
                                    '{"entity": "Paul McCartney", "keywords": ["born"]}]}',
                   dualrag_answer=lambda c: block("john lennon" if c[1]["content"].count("born in") == 2
                                                  else "i don't know"))
    replies.update(overrides)
    return ScriptedLLM(by_prompt(**replies))


def test_dualrag_reasons_retrieves_summarises_and_answers(make_system, cpu_config, sample_examples):
    llm = dualrag_llm(rounds=2)
    system = system_for(make_system, cpu_config, "dualrag", llm)
    result = system.answer_batch(to_batch([example(sample_examples, LENNON)]))
    assert result.answers == ["john lennon"]
    (trace,) = result.trace
    assert trace["route"] == "dualrag" and trace["sub_queries"][:2] == ["John Lennon born", "Paul McCartney born"]
    # round 2 retrieves the same references: nothing unseen for either entity, so no summary call in it, and the
    # query goes to the answer with what it knows (no reasoning step over unchanged knowledge)
    assert len(calls_of(llm, "dualrag_summarise")) == 2 and len(calls_of(llm, "dualrag_entities")) == 2
    assert len(calls_of(llm, "dualrag_reason")) == 2 and len(calls_of(llm, "dualrag_answer")) == 1
    outline = calls_of(llm, "dualrag_answer")[0][1]["content"]
    assert "John Lennon: born in 1940" in outline


def test_dualrag_stops_at_max_iter_with_a_final_reasoning_step(make_system, cpu_config, sample_examples):
    people = iter(["John Lennon", "Paul McCartney", "Ringo Starr"])  # a new entity each round: new references
    new_every_time = iter(range(100))
    llm = dualrag_llm(rounds=99, dualrag_summarise=lambda c: f"fact {next(new_every_time)}",
                      dualrag_entities=lambda c: json.dumps({"entities": [{"entity": next(people),
                                                                            "keywords": ["born"]}]}))
    system = system_for(make_system, cpu_config, "dualrag", llm, dualrag__max_iter=2, dualrag__top_k=1)
    result = system.answer_batch(to_batch([example(sample_examples, LENNON)]))
    assert len(calls_of(llm, "dualrag_entities")) == 2  # two rounds of retrieval
    assert len(calls_of(llm, "dualrag_reason")) == 3    # and a final reasoning step after the last one
    assert result.trace[0]["steps"] == 2 * 3 + 1 + 1  # (reason, entities, summarise) twice; reason; answer


def test_hybrid_hands_compound_questions_to_hanrag(make_system, cpu_config, sample_examples):
    llm = ScriptedLLM(by_prompt(
        hanrag_router=lambda c: "compound" if "born first" in question_of(c) else "single-step",
        hanrag_decompose='["when was john lennon born?", "when was paul mccartney born?"]',
        hanrag_relevance="yes", hanrag_aggregate=block("john lennon"),
        reasoning=lambda c: block("seed answer" if "inception" in question_of(c) else "a date")))
    cpu_config.multihop = "hanrag"
    system = make_system(llm)
    batch = [example(sample_examples, "who directed the movie inception?"), example(sample_examples, LENNON)]
    result = system.answer_batch(to_batch(batch))
    assert result.answers == ["seed answer", "john lennon"]
    routes = [t["route"] for t in result.trace]
    assert routes == ["single-step", "compound"]
    stages = [[r["stage"] for r in t["stages"]] for t in result.trace]
    assert stages[0][-2:] == ["reasoning", "answer"] and "reasoning" not in stages[1]


def test_the_report_shows_steps_by_question_type(tmp_path):
    from evaluation.report import format_markdown, format_table, score_records

    records = [{"verdict": "correct", "question_type": "comparison", "trace": {"route": "compound", "steps": 5}},
               {"verdict": "miss", "question_type": "comparison", "trace": {"route": "complex", "steps": 9}},
               {"verdict": "correct", "question_type": "simple", "trace": {"route": "single-step", "steps": 3}},
               {"verdict": "correct", "question_type": "simple", "trace": {"stages": []}}]  # a hybrid query
    summary = score_records(records)
    assert summary["routes"] == {"compound": 1, "complex": 1, "single-step": 1}
    assert summary["steps_by_question_type"] == {"comparison": {"queries": 2, "mean": 7.0, "max": 9},
                                                 "simple": {"queries": 1, "mean": 3.0, "max": 3}}
    assert "| comparison | 2 | 7.0 | 9 |" in format_markdown(summary, "run")
    assert "multi-hop steps by question type" in format_table(summary)
    assert "steps_by_question_type" not in score_records(records[3:])


def test_dualrag_answers_with_what_it_knows_when_the_deadline_nears(make_system, cpu_config, sample_examples):
    clock = TickingClock()
    llm = dualrag_llm(rounds=99)
    inner = llm.reply
    llm.reply = lambda conversation: (setattr(clock, "now", clock.now + 10.0), inner(conversation))[1]
    system = system_for(make_system, cpu_config, "dualrag", llm, dualrag__max_iter=10)
    states = [QueryState(0, "q0", LENNON, "03/10/2024", example(sample_examples, LENNON)["search_results"])]
    batch = system.batch(1)
    run_stage(stage_of(system, "references"), states, batch)  # before the clock starts
    batch.deadline = Deadline(45.0, clock=clock)  # reason, entities, two summaries; then the answer must fit
    run_stage(stage_of(system, "dualrag"), states, batch)
    assert len(calls_of(llm, "dualrag_entities")) == 1 and states[0].done
    assert states[0].answer == "i don't know" and "no time left" in states[0].done_reason
    assert "dualrag: no time for a step" in states[0].deadline_cuts


def test_hybrid_hands_complex_questions_to_dualrag(make_system, cpu_config, sample_examples):
    llm = dualrag_llm(rounds=1, hanrag_router=lambda c: "complex" if "born first" in question_of(c) else "single-step",
                      reasoning=block("seed answer"))
    cpu_config.multihop = "dualrag"
    system = make_system(llm)
    batch = [example(sample_examples, "who directed the movie inception?"), example(sample_examples, LENNON)]
    result = system.answer_batch(to_batch(batch))
    assert result.answers == ["seed answer", "john lennon"]
    assert [t["route"] for t in result.trace] == ["single-step", "complex"]
    assert len(calls_of(llm, "dualrag_answer")) == 1 and len(calls_of(llm, "reasoning")) == 1


def test_states_from_the_stage_cache_are_searchable_again(make_system, cpu_config, sample_examples):
    from evaluation.stage_cache import state_from_json, state_to_json

    system = make_system(ScriptedLLM())
    (state,) = [QueryState(0, "q0", LENNON, "", example(sample_examples, LENNON)["search_results"])]
    run_stage(stage_of(system, "references"), [state], system.batch(1))  # candidates and their vectors
    restored = state_from_json(json.loads(json.dumps(state_to_json(state))), state.pages)
    assert len(restored.candidates) == len(state.candidates) > 0  # their vectors kept exactly
    assert restored.candidate_vectors.dtype == state.candidate_vectors.dtype
    assert (restored.candidate_vectors == state.candidate_vectors).all()
    retriever = LocalRetriever(system.resource("embedder"))
    question = "when was lennon born"
    fresh, cached = retriever.search([Request(state, question), Request(restored, question)], k=3)
    assert [r.text for r in fresh] == [r.text for r in cached]
