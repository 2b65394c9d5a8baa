
import pytest

from models.stages.precheck import DynamicIDKSettings
from models.stages.reasoning import Parsed, fit_references, parse_structured
from models.state import Reference
from models.system import unpack_batch
from tests.conftest import to_batch
from tests.fakes import RecordingKG, ScriptedLLM, by_prompt, prompt_name
from tests.servers import free_port


def test_answers_every_query_in_order(make_system, sample_examples):
    def reply(conv: list[dict]) -> str:
        question = conv[1]["content"].split("Question: ")[1].splitlines()[0]
        return f"thinking...\n===START===\n## Answer: {question} ===END==="

    llm = ScriptedLLM(reply)
    system = make_system(llm)
    batch = to_batch(sample_examples[:4])
    answers = system.batch_generate_answer(batch)
    assert answers == batch["query"]  # each reply echoes its own question: order is kept
    assert len(llm.calls) == 1 and len(llm.calls[0][0]) == 4  # one backend call for the whole batch


def test_prompt_carries_the_relevant_page_text(make_system, sample_examples):
    llm = ScriptedLLM()
    make_system(llm).batch_generate_answer(to_batch(sample_examples[:1]))  # who directed inception?
    user = llm.calls[0][0][0][1]["content"]
    assert "Christopher Nolan" in user and "Inception (film) - FilmWiki" in user
    assert "window.analytics" not in user  # scripts never reach the prompt


def test_top_k_bounds_the_references(make_system, sample_examples, cpu_config):
    cpu_config.references.top_k = 2
    cpu_config.references.table_budget_chars = 0
    llm = ScriptedLLM()
    make_system(llm).batch_generate_answer(to_batch(sample_examples[:1]))
    assert llm.calls[0][0][0][1]["content"].count("\n[") == 2


@pytest.mark.parametrize("output, expected", [
    ("===START===\n## Answer: Paris\n## False Premise: no\n===END===", Parsed("Paris", False)),
    ("reasoning...\n===START===\n## Answer: **Paris**\n## False Premise: No", Parsed("Paris", False)),  # no END
    ("===START===\n## Answer: <the short answer>\n## False Premise: <yes or no>\n===END===\nSo:\n"
     "===START===\n## Answer: 42 days\n## False Premise: no\n===END===", Parsed("42 days", False)),  # echo first
    ("===START===\n## Answer: 3\n===END===\n===START===\n## Answer: 4\n===END===", Parsed("4", False)),  # repeats
    ("===START===\n## Answer: invalid question\n## False Premise: yes\n===END===", Parsed("invalid question", True)),
    ("no markers at all\nAnswer: Rome", Parsed("Rome", False)),
    ("## answer:   Lima  \n## false premise: YES", Parsed("Lima", True)),
    ("\n\nParis is the capital.\nMore text", None),
    ("===START===\n## Answer:\n===END===", None),
    ("", None),
])
def test_parse_structured(output, expected):
    assert parse_structured(output) == expected


def test_answers_are_normalised_and_trimmed(make_system, cpu_config, sample_examples):
    cpu_config.reasoning.max_tokens = 512  # the long answer is generated whole; the answer step trims it
    replies = iter(["===START===\n## Answer: I Don\u2019t Know.\n===END===",
                    "===START===\n## Answer: Invalid question.\n===END===",
                    "===START===\n## Answer: " + "word, " * 200 + "\n===END===", None])
    answers = make_system(ScriptedLLM(lambda conv: next(replies))).batch_generate_answer(to_batch(sample_examples[:4]))
    assert answers[:2] == ["i don't know", "invalid question"]
    assert answers[2] == ", ".join(["word"] * 38)  # 38 words, 37 commas: 75 Llama-2 tokens, cut before a comma
    assert answers[3] == "i don't know"  # the LLM returned no sample for it


def test_no_time_left_skips_llm_and_answers_idk(make_system, sample_examples):
    llm = ScriptedLLM()
    system = make_system(llm, per_query_s=0.2, safety_margin_s=0.5)  # 0.3 s for a batch of 4
    result = system.answer_batch(to_batch(sample_examples[:4]))
    answers = result.answers
    assert answers == ["i don't know"] * 4 and llm.calls == []
    statuses = {r["stage"]: r["status"] for r in result.trace[0]["stages"]}
    assert statuses["reasoning"] == "skipped" and statuses["answer"] == "ok"


def test_llm_crash_answers_idk_for_the_batch(make_system, sample_examples):
    def explode(conv):
        raise RuntimeError("CUDA out of memory")

    system = make_system(ScriptedLLM(explode))
    result = system.answer_batch(to_batch(sample_examples[:2]))
    assert result.answers == ["i don't know"] * 2
    assert "reasoning failed" in result.trace[0]["reason"]


def test_malformed_batches_get_defined_answers(make_system, sample_examples):
    system = make_system()
    good = to_batch(sample_examples[:3])
    uneven = dict(good, search_results=good["search_results"][:1], query_time=good["query_time"][:2])
    assert len(system.batch_generate_answer(uneven)) == 3
    missing = {"query": good["query"]}
    assert len(system.batch_generate_answer(missing)) == 3
    assert system.batch_generate_answer(dict(good, query=["", None, 5])) == ["i don't know"] * 3
    assert system.batch_generate_answer("not a batch") == []
    assert system.batch_generate_answer({}) == []


@pytest.mark.parametrize("pages", [[], "not a list", [{"page_result": None}], [{"page_result": 42}],
                                   [{"page_result": ""}], [{"page_result": "<html><body></body></html>"}],
                                   ["not a page dict"]])
def test_pages_without_text_answer_idk_without_calling_llm(make_system, sample_examples, pages):
    llm = ScriptedLLM()
    system = make_system(llm)
    batch = to_batch(sample_examples[:1])
    batch["search_results"] = [pages]
    result = system.answer_batch(batch)
    assert result.answers == ["i don't know"]
    assert llm.calls == []
    assert result.trace[0]["reason"] == "no usable text in the search results and no KG result"


def test_snippet_alone_is_a_reference(make_system):
    llm = ScriptedLLM()
    batch = {"interaction_id": ["x"], "query": ["who?"], "query_time": ["t"],
             "search_results": [[{"page_name": "P", "page_snippet": "Ada wrote it.", "page_result": None}]]}
    make_system(llm).batch_generate_answer(batch)
    assert "Ada wrote it." in llm.calls[0][0][0][1]["content"]


def test_unpack_batch_keeps_positions():
    states = unpack_batch({"interaction_id": ["a", 7, None], "query": ["q1", "q2", "q3"], "query_time": ["t"] * 3,
                           "search_results": [[], [], []]})
    assert [s.interaction_id for s in states] == ["a", "7", "#2"] and [s.index for s in states] == [0, 1, 2]


def test_references_fit_the_prompt_budget_best_first():
    refs = [Reference("a" * 40, "chunk"), Reference("b" * 40, "chunk"), Reference("c" * 10, "chunk")]
    assert [r.text[0] for r in fit_references(refs, 85)] == ["a", "b"]  # stops at the first that does not fit
    assert [r.text[0] for r in fit_references(refs, 5)] == ["a"]  # the best one always goes in
    assert fit_references([], 100) == []


def test_prompt_budget_applies_in_the_pipeline(make_system, sample_examples, cpu_config):
    cpu_config.reasoning.max_reference_chars = 1
    llm = ScriptedLLM()
    make_system(llm).batch_generate_answer(to_batch(sample_examples[:1]))
    assert llm.calls[0][0][0][1]["content"].count("\n[") == 1


# --- task-aware runs: the KG before the dynamic pre-check and the evidence check -----------------------------

def _kg_config(cpu_config, dynamic_idk=True):
    cpu_config.task = 2
    cpu_config.attributes.method = "icl"
    cpu_config.section("answer", DynamicIDKSettings).dynamic_idk = dynamic_idk


def prompts_sent(llm, name):
    return [conv for conversations, _ in llm.calls for conv in conversations if prompt_name(conv) == name]


def _stages(result):
    return [[r["stage"] for r in trace["stages"]] for trace in result.trace]


PRICE = {"2024-03-06 00:00:00 EST": {"Open": 880.0, "Close": 887.0}}
NVDA = {"finance_get_info": lambda body: {"longName": "NVIDIA Corporation"} if body["query"] == "NVDA" else None,
        "finance_get_price_history": lambda body: PRICE if body["query"] == "NVDA" else None}
KG_REPLIES = dict(attributes="domain: finance\ndynamism: real-time",
                  kg_entities='{"domain": "finance", "entities": {"ticker": "NVDA"}}',
                  reasoning=lambda conv: "===START===\n## Answer: " + ("887" if "887" in conv[1]["content"]
                                                                       else "no idea") + "\n===END===")


def test_a_dynamic_query_the_kg_answers_is_attempted(make_system, sample_examples, cpu_config):
    _kg_config(cpu_config)
    system = make_system(ScriptedLLM(by_prompt(**KG_REPLIES)), kg=RecordingKG(NVDA))
    result = system.answer_batch(to_batch(sample_examples[5:6]))
    assert result.answers == ["887"]
    assert _stages(result)[0][:5] == ["attributes", "kg", "precheck", "references", "evidence"]


def test_a_dynamic_query_with_nothing_from_the_kg_is_idk_before_the_llm(make_system, sample_examples, cpu_config):
    _kg_config(cpu_config)
    llm = ScriptedLLM(by_prompt(**KG_REPLIES))
    system = make_system(llm, kg=RecordingKG({}))
    result = system.answer_batch(to_batch(sample_examples[5:6]))
    assert result.answers == ["i don't know"]
    assert "predicted real-time" in result.trace[0]["reason"]
    assert not prompts_sent(llm, "reasoning")
    assert _stages(result)[0] == ["attributes", "kg", "precheck", "answer"]  # no page processing either


def test_without_pages_the_kg_still_answers(make_system, sample_examples, cpu_config):
    _kg_config(cpu_config, dynamic_idk=False)
    batch = to_batch(sample_examples[5:6])
    batch["search_results"] = [[]]
    system = make_system(ScriptedLLM(by_prompt(**KG_REPLIES)), kg=RecordingKG(NVDA))
    result = system.answer_batch(batch)
    assert result.answers == ["887"]
    assert ("references", "ok") in [(r["stage"], r["status"]) for r in result.trace[0]["stages"]]


def test_no_kg_server_means_no_kg_stage(make_system, cpu_config, sample_examples, caplog_loguru):
    cpu_config.task = 2
    cpu_config.section("kg").base_url = f"http://127.0.0.1:{free_port()}"
    cpu_config.section("kg").connect_timeout_s = 0.5
    system = make_system(ScriptedLLM())
    result = system.answer_batch(to_batch(sample_examples[:1]))
    assert system.resource("kg") is None and "kg" not in _stages(result)[0]
    assert "no KG server answers" in caplog_loguru.text and "the kg stage is off" in caplog_loguru.text


def test_each_query_leaves_a_record_of_what_it_went_through(make_system, sample_examples, cpu_config, tmp_path):
    from evaluation.runner import load_predictions, run_model

    _kg_config(cpu_config, dynamic_idk=False)
    cpu_config.calculator.enabled = True
    replies = dict(KG_REPLIES, calculator="```python\n887 - 880  # change since the open\n```")
    system = make_system(ScriptedLLM(by_prompt(**replies)), kg=RecordingKG(NVDA))
    path = tmp_path / "predictions.jsonl"
    run_model(system, iter(sample_examples[5:6]), path, per_query_s=None)
    (record,) = load_predictions(path).values()  # read back from the file, as a user would
    trace = record["trace"]
    assert record["prediction"] == "887" and trace["predicted"] == {"domain": "finance", "dynamism": "real-time"}
    assert [s["stage"] for s in trace["stages"]] == ["attributes", "kg", "references", "evidence", "calculator",
                                                     "reasoning", "answer"]  # dynamic_idk off: no precheck
    assert all(s["status"] == "ok" for s in trace["stages"])
    calls = {(c["call"], c["args"].get("query") or c["args"].get("ticker_name"), c["answered"])
             for c in trace["kg_calls"]}
    assert ("finance_get_price_history", "NVDA", True) in calls
    assert any("887" in line for line in trace["kg_results"])
    assert trace["calculations"] == ["887 - 880 = 7  (change since the open)"]
    pages = {page["page_name"] for page in sample_examples[5]["search_results"]}
    assert trace["references"] and all(r["page"] in pages and r["text"] for r in trace["references"])
    scores = [r["score"] for r in trace["references"] if r["kind"] != "table"]
    assert scores == sorted(scores, reverse=True)


def test_an_idk_record_says_why(make_system, sample_examples, cpu_config, tmp_path):
    _kg_config(cpu_config)
    system = make_system(ScriptedLLM(by_prompt(**KG_REPLIES)), kg=RecordingKG({}))
    result = system.answer_batch(to_batch(sample_examples[5:6]))
    (record,) = result.trace
    assert record["reason"].startswith("predicted real-time") and record["references"] == []
    assert record["kg_calls"] and not any(c["answered"] for c in record["kg_calls"])
