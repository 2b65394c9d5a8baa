"""Per-query isolation: a bad item or a bad reply costs that query only, whatever the rest of its batch is."""

import copy
import time
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import models.stages.reasoning as reasoning
from models.system import CragSystem
from tests.conftest import to_batch
from tests.fakes import HashEmbedder, RecordingKG, ScriptedLLM

ECHO = "===START===\n## Answer: {}\n## False Premise: no\n===END==="


def question(conversation) -> str:
    return conversation[1]["content"].split("Question: ")[1].splitlines()[0]


def echo(conversation) -> str:
    return ECHO.format(question(conversation))  # the reasoning prompt's question, as the answer


def test_a_reply_that_breaks_the_parser_costs_its_query_only(make_system, sample_examples, monkeypatch):
    parse = reasoning.parse_structured

    def fragile(output):  # a parser bug that only one reply triggers
        if "BOOM" in output:
            raise ValueError("unexpected reply shape")
        return parse(output)

    monkeypatch.setattr(reasoning, "parse_structured", fragile)
    batch = to_batch(sample_examples[:4])
    bad = batch["query"][2]
    llm = ScriptedLLM(lambda conv: "BOOM" if question(conv) == bad else echo(conv))
    system = make_system(llm)
    result = system.answer_batch(batch)
    answers = result.answers
    assert answers == [q if q != bad else "i don't know" for q in batch["query"]]
    trace = result.trace
    assert trace[2]["reason"].startswith("reasoning failed: ValueError: unexpected reply shape")
    statuses = [{s["stage"]: s["status"] for s in record["stages"]}["reasoning"] for record in trace]
    assert statuses == ["ok", "ok", "failed", "ok"]
    assert len(llm.calls) > 1  # the batch went in one call, then in halves to find the query


def test_a_stage_that_fails_half_way_leaves_no_half_written_state(make_system, sample_examples, monkeypatch):
    """The failed query's fields are put back as they were before the stage, so a later stage never reads a
    half-written answer."""
    stage_cls = reasoning.ReasoningStage
    run = stage_cls.run

    def run_then_fail(self, states, ctx):
        run(self, states, ctx)
        if any("inception" in s.query for s in states):
            for state in states:
                state.llm_output = "half-written"
            raise RuntimeError("late failure")

    monkeypatch.setattr(stage_cls, "run", run_then_fail)
    system = make_system(ScriptedLLM(echo))
    batch = to_batch(sample_examples[:2])  # the first question is about inception
    result = system.answer_batch(batch)
    answers = result.answers
    assert answers == ["i don't know", batch["query"][1]]
    assert result.trace[0]["reason"].startswith("reasoning failed: RuntimeError: late failure")


def test_a_backend_returning_the_wrong_shape_costs_the_missing_queries_only(make_system, sample_examples,
                                                                          caplog_loguru):
    class Short(ScriptedLLM):
        def generate(self, conversations, params):
            outputs = super().generate(conversations, params)
            return outputs[:-1] + [[None, 42, "a str"]]  # the last conversation's samples are not Samples

    batch = to_batch(sample_examples[:3])
    answers = make_system(Short(echo)).batch_generate_answer(batch)
    assert answers == [*batch["query"][:2], "i don't know"]
    assert "what was not a list of Samples counts as no reply" in caplog_loguru.text


_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
_page = st.one_of(
    st.fixed_dictionaries({}, optional={
        "page_name": st.one_of(_text, st.none(), st.integers()),
        "page_url": st.one_of(_text, st.none()),
        "page_snippet": st.one_of(_text, st.none(), st.lists(_text, max_size=2)),
        "page_last_modified": st.one_of(_text, st.none(), st.floats()),
        "page_result": st.one_of(
            st.none(), st.integers(), _text, st.binary(max_size=64),
            _text.map(lambda t: f"<html><body><table><tr><td>{t}</td></tr></table><p>{t}</p></body></html>"),
            st.just("<html>" + "<div>" * 2000 + "deep" + "</div>" * 2000 + "</html>"),
            st.just("\x00\ufffd\u202e\U0001f600 " * 200))}),
    st.none(), _text, st.integers(), st.lists(st.integers(), max_size=2))
_item = st.fixed_dictionaries({
    "interaction_id": st.one_of(_text, st.none(), st.integers()),
    "query": st.one_of(_text, st.none(), st.integers(), st.just("x" * 5000)),
    "query_time": st.one_of(_text, st.none(), st.floats(allow_nan=True)),
    "search_results": st.one_of(st.lists(_page, max_size=3), st.none(), _text, st.dictionaries(_text, _text,
                                                                                                 max_size=2))})


@pytest.mark.parametrize("every_stage", [False, True], ids=["references-and-reasoning", "every-stage"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(items=st.lists(_item, min_size=1, max_size=3), position=st.integers(0, 3))
def test_fuzzed_items_never_cost_a_good_query_its_answer(make_system, cpu_config, sample_examples, every_stage,
                                                         items, position):
    """Any mix of malformed items around one real question: a list of strings of the batch's length, and the
    real question answered exactly as it is alone; with every stage on too (task 2 with a KG, ICL attributes,
    the knowledge extractor and the calculator)."""
    kg = None
    if every_stage:
        cpu_config.task, cpu_config.attributes.method = 2, "icl"
        cpu_config.knowledge.enabled = cpu_config.calculator.enabled = True
        kg = RecordingKG({"movie_get_person_info": [{"name": "x"}]})
    system = make_system(ScriptedLLM(lambda conv: echo(conv) if "Question: " in conv[1]["content"] else "{}"), kg=kg)
    good = sample_examples[0]
    alone = system.batch_generate_answer(to_batch([good]))
    mixed = copy.deepcopy(items)
    at = min(position, len(mixed))
    mixed.insert(at, {key: good[key] for key in ("interaction_id", "query", "query_time", "search_results")})
    batch = {key: [item[key] for item in mixed] for key in ("interaction_id", "query", "query_time", "search_results")}
    answers = system.batch_generate_answer(batch)
    assert isinstance(answers, list) and len(answers) == len(mixed)
    assert all(isinstance(answer, str) for answer in answers)
    assert answers[at] == alone[0]


def _reasoning_answer(body: dict) -> str:
    """The reasoning prompt's question as its answer; "OK" to the start-up probe."""
    content = body["messages"][-1]["content"]
    if "Question: " not in content:
        return "OK"
    return f"===START=== ## Answer: {content.split('Question: ')[1].splitlines()[0]} ===END==="  # words only


def _about(body: dict, query: str) -> bool:
    return f"Question: {query}" in body["messages"][-1]["content"]


def _openai_system(cpu_config, url: str, clock: Callable[[], float] = time.monotonic) -> CragSystem:
    cpu_config.llm.backend = "openai"
    cpu_config.llm.openai.base_url = url
    cpu_config.llm.openai.max_retries = 0
    return CragSystem(cpu_config, embedder=HashEmbedder(), clock=clock)  # the openai backend, probed at start-up


def test_a_faulty_llm_server_costs_only_the_queries_it_fails(cpu_config, sample_examples, caplog_loguru):
    """A real OpenAI-style server on a loopback port: garbage for one query, a 5 MB reply for another; the third
    is answered. The batch has minutes (no reply here is slow), so how busy the machine is changes nothing."""
    from tests.unit.test_llm_backends import ChatServer

    batch = to_batch(sample_examples[:3])
    garbage, huge = batch["query"][:2]
    server = ChatServer(answer_with=_reasoning_answer,
                        raw_body=lambda body: (b"<html>bad gateway</html>" if _about(body, garbage)
                                               else b"x" * 5_000_000 if _about(body, huge) else None))
    cpu_config.budget.per_query_s = 60.0
    system = _openai_system(cpu_config, server.url)
    try:
        answers = system.batch_generate_answer(batch)
    finally:
        system.close()
        server.close()
    assert answers == ["i don't know", "i don't know", batch["query"][2]]
    assert "reply not used: not JSON" in caplog_loguru.text and "llm.openai.max_reply_bytes" in caplog_loguru.text


def test_a_reply_trickled_past_the_batch_deadline_is_left_there(cpu_config, sample_examples, caplog_loguru):
    """A server that sends its reply 16 bytes a second, so that it cannot arrive in under 15 s, against a batch
    deadline of 9.5 s. The batch's clock stands still until the server has the reasoning request (however long the
    stages before it took), then runs: the request is sent with 9.5 s left and the batch is left at its deadline,
    answering "i don't know". A batch that waited for the reply would log it "finished after ..., past the deadline"."""
    from tests.unit.test_llm_backends import ChatServer

    server = ChatServer(answer_with=_reasoning_answer,
                        trickle_s=lambda body: 1.0 if "Question: " in body["messages"][-1]["content"] else 0.0)
    started, lag = time.monotonic(), []

    def clock() -> float:
        if not lag and any("Question: " in r["body"]["messages"][-1]["content"] for r in server.requests):
            lag.append(time.monotonic() - started)
        return time.monotonic() - lag[0] if lag else started

    cpu_config.budget.per_query_s, cpu_config.budget.safety_margin_s = 10.0, 0.5
    system = _openai_system(cpu_config, server.url, clock)
    try:
        result = system.answer_batch(to_batch(sample_examples[2:3]))
    finally:
        system.close()
        server.close()
    assert result.answers == ["i don't know"]
    assert sum("Question: " in r["body"]["messages"][-1]["content"] for r in server.requests) == 1
    assert "requests cut by the batch deadline: the reply was still arriving" in caplog_loguru.text
    assert result.trace[0]["reason"] == "reasoning: the deadline came before any text"


def test_an_llm_that_fails_after_the_probe_leaves_answers_that_say_so(cpu_config, sample_examples):
    """A server that answers the start-up probe, then HTTP 500 to every request: each answer is "i don't know"
    with the failure as its reason and in its record (`llm_failures`), not an answer the model chose."""
    from tests.unit.test_llm_backends import ChatServer

    server = ChatServer(answer_with=_reasoning_answer, fail_after=1, status=500)
    system = _openai_system(cpu_config, server.url)
    try:
        result = system.answer_batch(to_batch(sample_examples[:2]))
    finally:
        system.close()
        server.close()
    assert result.answers == ["i don't know"] * 2
    for trace in result.trace:
        assert trace["reason"].startswith("reasoning: the LLM call failed (InternalServerError: ")
        assert trace["llm_failures"] and all(f.startswith("reasoning: InternalServerError") for f in
                                             trace["llm_failures"])
