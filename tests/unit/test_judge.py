"""The LLM judge with a scripted LLM: parsing, retries, unjudged, the cache; the report files."""

import json
import math
import re

import pytest

import local_evaluation
from evaluation.judge import (
    LLMJudge,
    build_judge,
    judge_by_organisers_rules,
    judge_by_rules,
    judge_records,
    p_correct,
    parse_judgement,
)
from evaluation.person_judge import PersonJudge
from evaluation.report import format_table, score_records, write_report
from evaluation.verdicts import CORRECT, MISS, UNJUDGED, WRONG, Item
from models.llm.backend import Sample
from models.prompting import PromptLibrary
from tests.conftest import SAMPLE, write
from tests.fakes import ScriptedLLM
from tests.unit.test_llm_backends import ChatServer, verdict_alternatives
from utils.cache import JsonCache

ITEMS = [Item("who directed inception?", "christopher nolan", (), "It was Nolan, the British director"),
         Item("capital of france?", "paris", ("Paris, France",), "Lyon")]


@pytest.mark.parametrize("reply, expected", [
    ("Correct.", True), ("INCORRECT, because the year differs", False), ("correct - same person", True),
    ("  Incorrect: Lyon is not Paris", False), ("The answer is correct", None), ("no idea", None),
    ('{"correct": true, "reason": "same person"}', True),
    ('Sure! {"correct": false}', False),
    ('{"score": 1}', True), ('{"Accuracy": "False"}', False), ('{"accuracy": "True", "x": {"y": 1}}', True),
    ('correct: yes', True), ('"correct" = 0', False),
    ('{"correct": "maybe"}', None), ("I think so", None), ("", None), ("{not json", None),
])
def test_parse_judgement(reply, expected):
    verdict, _ = parse_judgement(reply)
    assert verdict is expected if expected is None else verdict == expected


def test_the_reason_is_what_follows_the_verdict():
    assert parse_judgement("INCORRECT, because the year differs") == (False, "because the year differs")
    assert parse_judgement('{"correct": true, "reason": "same person"}') == (True, "same person")


LOG = math.log


@pytest.mark.parametrize("top, expected", [
    (({"Correct": LOG(0.9), " Incorrect": LOG(0.05), "The": LOG(0.05)},), 0.9 / 0.95),
    (({"**": LOG(0.99)}, {"in": LOG(0.6), "correct": LOG(0.2), "I": LOG(0.2)}), 0.25),  # starts at the word
    (({" WRONG": LOG(0.5), "Cor": LOG(0.5)},), 0.5),
    (({"I": LOG(0.7), "c": LOG(0.3)},), None),  # one letter is no verdict word
    (({"The": LOG(0.9), "Paris": LOG(0.1)},), None), ((), None),
])
def test_p_correct_reads_the_first_word(top, expected):
    result = p_correct(top)
    assert result is None if expected is None else result[0] == pytest.approx(expected)


def test_log_probabilities_give_each_llm_verdict_its_confidence_and_read_an_unusable_reply(tmp_path):
    sure = ({"Correct": LOG(0.95), "Incorrect": LOG(0.04)},)
    unsure = ({"Incorrect": LOG(0.55), "Correct": LOG(0.43)},)
    replies = {"Nolan": Sample("Correct. same person", top_logprobs=sure),
               "Lyon": Sample("Incorrect, another city", top_logprobs=unsure),
               "Marseille": Sample("Correctly identified? no", top_logprobs=({"Correct": LOG(0.2),
                                                                               "Incorrect": LOG(0.7)},))}
    judge, _ = judge_with(lambda conv: next(v for k, v in replies.items() if k in conv[1]["content"]), tmp_path)
    records = [{"query": "q", "answer": "christopher nolan", "prediction": "It was Nolan"},
               {"query": "q", "answer": "paris", "prediction": "Lyon"},
               {"query": "q", "answer": "paris", "prediction": "Marseille"}]
    judge_records(records, judge)
    assert [(r["verdict"], r["judge_confidence"]) for r in records] == [
        (CORRECT, pytest.approx(0.95 / 0.99, abs=1e-4)), (WRONG, pytest.approx(0.55 / 0.98, abs=1e-4)),
        (WRONG, pytest.approx(0.7 / 0.9, abs=1e-4))]
    assert records[2]["judge_reason"].startswith("log-probabilities: P(correct) = 0.22")
    summary = score_records(records)
    assert summary["judge_confidence"] == {"verdicts": 3, "uncertain": 1, "below": 0.75}
    assert "of which 1 uncertain (P(verdict) < 0.75" in format_table(summary)
    again, llm = judge_with(lambda conv: "unused", tmp_path)  # the probabilities are cached with the verdicts
    judge_records(records, again)
    assert llm.calls == [] and records[1]["judge_confidence"] == pytest.approx(0.5612, abs=1e-4)
    judge_records(records, None)  # the rules alone give no confidence, and an earlier one does not stay
    assert "judge_confidence" not in records[2] and "judge_confidence" not in score_records(records)


def judge_with(reply, tmp_path=None, retries=2):
    cache = JsonCache(tmp_path) if tmp_path else None
    llm = ScriptedLLM(reply)
    return LLMJudge(llm, PromptLibrary().get("judge"), "scripted", cache, batch_size=8, retries=retries), llm


def test_llm_verdicts_and_the_cache(tmp_path):
    def reply(conv: list[dict]) -> str:
        return '{"correct": %s}' % ("true" if "Nolan" in conv[1]["content"] else "false")

    judge, llm = judge_with(reply, tmp_path)
    assert judge.judge(ITEMS) == [CORRECT, WRONG]
    prompt = llm.calls[0][0][1][1]["content"]
    assert "- paris" in prompt and "- Paris, France" in prompt and "Prediction: Lyon" in prompt
    again, llm_again = judge_with(reply, tmp_path)  # a new judge over the same cache folder
    assert again.judge(ITEMS) == [CORRECT, WRONG] and llm_again.calls == []


def test_unparsable_replies_are_retried_then_unjudged(caplog_loguru):
    replies = iter(["no idea", '{"correct": true}', "still no idea", "nope", "nothing"])
    judge, llm = judge_with(lambda conv: next(replies), retries=2)
    assert judge.judge(ITEMS) == [UNJUDGED, CORRECT]  # the first stays unparsable through both retries
    assert len(llm.calls) == 3  # the first try and two retries, each with only the undecided items
    assert "no usable reply for 1 of 2 predictions (0 decided by the rules, 1 unjudged)" in caplog_loguru.text


def test_the_rules_decide_what_the_judge_leaves_unusable_where_they_can():
    items = [Item("q", "paris", (), "It is Paris, of course"), Item("q", "paris", (), "Lyon")]
    judge, _ = judge_with(lambda conv: "hmm", retries=0)
    assert judge.judge(items) == [CORRECT, UNJUDGED] and judge.fallbacks == 1
    records = [{"query": i.query, "answer": i.answer, "prediction": i.prediction} for i in items]
    judge_records(records, judge)
    assert [r["judged_by"] for r in records] == ["rules-fallback", "none"]


def test_a_judge_backend_that_raises_leaves_predictions_unjudged():
    def down(conv):
        raise ConnectionError("judge server down")
    judge, _ = judge_with(down, retries=0)
    assert judge.judge(ITEMS) == [UNJUDGED, UNJUDGED]


def test_judge_records_uses_rules_first_and_the_llm_for_the_rest():
    records = [{"query": "q", "answer": "paris", "alt_answers": [], "prediction": "Paris."},
               {"query": "q", "answer": "paris", "alt_answers": [], "prediction": "i don't know"},
               {"query": "q", "answer": "paris", "alt_answers": [], "prediction": "It is Paris, of course"}]
    judge, llm = judge_with(lambda conv: '{"correct": true}')
    judge_records(records, judge)
    assert [(r["verdict"], r["judged_by"]) for r in records] == [("correct", "rules"), ("miss", "rules"),
                                                                 ("correct", "llm")]
    # one call: the question neither rule decides, asked once for both columns, and "Paris." for the
    # organisers' column, whose exact match keeps the full stop
    assert len(llm.calls) == 1 and len(llm.calls[0][0]) == 2
    assert [r["organisers_judged_by"] for r in records] == ["llm", "rules", "llm"]
    judge_records(records, None)
    assert records[2]["verdict"] == "wrong"  # rules only: no exact match is wrong


def test_a_person_s_verdicts_judge_what_the_rules_leave_open(tmp_path, caplog_loguru):
    verdicts = tmp_path / "verdicts.jsonl"
    write(verdicts, json.dumps({"query": "Who?", "prediction": "It is  Paris, of course", "human": "correct"}) + "\n"
          + json.dumps({"query": "who?", "prediction": "Lyon, I think", "human": "incorrect"}) + "\n")
    records = [{"query": "who?", "answer": "paris", "alt_answers": [], "prediction": p}
               for p in ("Paris", "It is Paris, of course", "Lyon, I think", "Marseille")]
    judge_records(records, PersonJudge.load(verdicts))
    assert [(r["verdict"], r["judged_by"]) for r in records] == [
        ("correct", "rules"), ("correct", "person"), ("wrong", "person"), ("unjudged", "none")]
    assert [r["organisers_verdict"] for r in records] == ["correct", "correct", "wrong", "unjudged"]
    assert "no verdict for 1 of" in caplog_loguru.text  # the organisers' column asks again: never guessed


def test_a_chain_asks_the_containment_rules_only_what_the_person_never_saw(tmp_path, capsys):
    verdicts = tmp_path / "verdicts.jsonl"
    write(verdicts, json.dumps({"query": "who?", "prediction": "Paris is not it", "human": "correct"}) + "\n")
    records = [{"query": "who?", "answer": "paris", "alt_answers": [], "prediction": p}
               for p in ("Paris", "Paris is not it", "It is Paris, of course", "Lyon, I think")]
    judge_records(records, build_judge(f"person:{verdicts}+contains", None))
    assert [(r["verdict"], r["judged_by"]) for r in records] == [
        ("correct", "rules"), ("correct", "person"), ("correct", "contains"), ("wrong", "contains")]
    assert records[1]["judge_reason"] == "person:verdicts.jsonl: correct"  # the person's, where the rules negate
    assert [r["organisers_verdict"] for r in records] == ["correct", "unjudged", "unjudged", "unjudged"]
    for spec in ("rules+contains", f"person:{verdicts}+"):
        args = ["--judge", spec, "--data", str(SAMPLE), "--out", str(tmp_path / "run")]
        assert local_evaluation.main(args) == 2
        assert "join judges with +" in capsys.readouterr().err


@pytest.mark.parametrize("text, message", [
    ("", "no verdicts"), ("{\"query\": \"q\"}\n", ":1: not a {query, prediction, human} record"),
    ('{"query": "q", "prediction": "p", "human": "maybe"}\n', ":1: human must be one of"),
])
def test_a_verdicts_file_that_cannot_be_read_is_one_line(tmp_path, capsys, text, message):
    write(tmp_path / "v.jsonl", text)
    args = ["--judge", f"person:{tmp_path / 'v.jsonl'}", "--data", str(SAMPLE), "--out", str(tmp_path / "run")]
    assert local_evaluation.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


@pytest.mark.parametrize("prediction, answer, alt, ours, theirs", [
    ("I don't know", "paris", (), MISS, MISS),
    ("well, i don't know it", "paris", (), MISS, MISS),
    ("i don\u2019t know", "paris", (), MISS, None),  # their test is the ASCII phrase only
    ("I am not sure", "paris", (), MISS, None),
    ("Paris", " PARIS ", (), CORRECT, CORRECT),
    ("Paris, France", "paris", ("paris, france",), CORRECT, None),  # alternative answers are ours only
    ("invalid", "invalid question", (), None, CORRECT),  # "invalid" in both is enough for them
    ("the premise is invalid", "invalid question", (), None, CORRECT),  # ours: a rejected premise, for the judge
    ("invalid question", "paris", (), WRONG, WRONG),
    ("paris", "invalid question", (), WRONG, WRONG),
    ("It is Paris", "paris", (), None, None),
])
def test_our_rules_and_the_organisers(prediction, answer, alt, ours, theirs):
    item = Item("q", answer, alt, prediction)
    assert (judge_by_rules(item), judge_by_organisers_rules(item)) == (ours, theirs)


def test_both_columns_read_the_prediction_as_the_grader_cuts_it():
    long = "paris " + "and more words " * 40 + "i don't know"  # the grader never sees the last phrase
    item = Item("q", "paris", (), long)
    assert judge_by_organisers_rules(item) is None and judge_by_rules(item) is None


def test_the_organisers_column_asks_the_llm_with_the_gold_answer_only():
    records = [{"query": "q", "answer": "paris", "alt_answers": ["paris, france"], "prediction": "Paris, France"},
               {"query": "q", "answer": "paris", "alt_answers": [], "prediction": "It is Paris"},
               {"query": "q", "answer": "invalid question", "alt_answers": [], "prediction": "invalid"}]
    judge_records(records, None)
    assert [(r["verdict"], r["organisers_verdict"]) for r in records] == [
        (CORRECT, UNJUDGED), (WRONG, UNJUDGED), (WRONG, CORRECT)]  # without an LLM judge theirs is never guessed
    judge, llm = judge_with(lambda conv: '{"correct": %s}' % ("false" if "- paris, france" in conv[1]["content"]
                                                                 else "true"))
    judge_records(records, judge)
    assert [(r["verdict"], r["organisers_verdict"], r["organisers_judged_by"]) for r in records] == [
        (CORRECT, CORRECT, "llm"), (CORRECT, CORRECT, "llm"), (CORRECT, CORRECT, "rules")]
    asked = [conv[1]["content"] for conversations, _ in llm.calls for conv in conversations]
    assert len(asked) == 3 and all("- paris, france" not in text for text in asked)  # one question, asked once


def test_the_report_shows_both_columns_and_the_cut_answers(tmp_path):
    records = [{"query": "q", "answer": "paris", "alt_answers": ["paris, france"], "prediction": "Paris, France",
                "domain": "open"},
               {"query": "q", "answer": "paris", "alt_answers": [], "prediction": "paris " + "and lyon " * 60,
                "domain": "open"}]
    judge_records(records, None)
    summary = score_records(records)
    assert summary["overall"]["accuracy"] == 0.5 and summary["organisers"]["overall"]["unjudged"] == 1.0
    assert summary["cut_by_grader"] == 1 and summary["organisers"]["by_domain"]["open"]["total"] == 2
    table = format_table(summary)
    assert "org.score" in table and "answers the grader cuts at 75 Llama-2 tokens: 1" in table
    write_report(summary, records, tmp_path, "both")
    assert "## By the organisers' rules" in (tmp_path / "report.md").read_text()


def test_report_files_carry_every_breakdown(tmp_path):
    records = [json.loads(line) for line in SAMPLE.read_text().splitlines()][:12]
    for i, record in enumerate(records):
        record.update(prediction=record["answer"] if i % 2 else "i don't know", batch_seconds=8.0, batch_size=4,
                      popularity="head" if i % 3 else "tail",
                      trace={"stages": [{"stage": "reasoning", "status": "ok", "seconds": 4.0}]})
    judge_records(records, None)
    summary = score_records(records)
    assert summary["overall"]["accuracy"] == 0.5 and summary["overall"]["missing"] == 0.5
    assert set(summary) >= {"by_domain", "by_question_type", "by_static_or_dynamic", "by_popularity"}
    assert (
        summary["latency_s"]["per_query"]["p50"] == 2.0 and summary["latency_s"]["per_stage"]["reasoning"]["max"] == 1.0
    )
    written = write_report(summary, records, tmp_path, "test run")
    names = {p.name for p in written}
    assert {"report.json", "report.md", "chart_overall.png", "chart_by_domain.png", "chart_by_popularity.png"} <= names
    markdown = (tmp_path / "report.md").read_text()
    assert "## By question type" in markdown and "| simple_w_condition |" in markdown and "| reasoning |" in markdown
    assert all(p.stat().st_size > 1000 for p in written if p.suffix == ".png")


def test_cli_rejudges_without_loading_the_model(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    records = [json.loads(line) for line in SAMPLE.read_text().splitlines()][:3]
    with (out / "predictions.jsonl").open("w") as handle:
        for record in records:
            record.pop("search_results")
            record.update(prediction=record["answer"], alt_answers=[], batch_seconds=1.0, batch_size=1)
            handle.write(json.dumps(record) + "\n")
    assert local_evaluation.main(["rejudge", "--data", str(SAMPLE), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "overall" in printed and (out / "report.md").exists()
    assert json.loads((out / "report.json").read_text())["overall"]["accuracy"] == 1.0


@pytest.mark.parametrize("args, message", [
    (["--judge", "gpt"], "use facts, contains, rules, local, person:FILE, or an http(s) base URL"),
    (["--judge", "person:no/such.jsonl"], "no such file; give person:FILE"),
    (["--judge", "http://127.0.0.1:9/v1"], "--judge-model"),
    (["rejudge"], "does not exist; answer the questions first (run)"),
])
def test_cli_judge_errors_are_one_line(tmp_path, capsys, args, message):
    assert local_evaluation.main([*args, "--data", str(SAMPLE), "--out", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


# --- a judge that cannot work stops the run before it starts; unjudged answers are bounded ----------------------

@pytest.mark.parametrize("status, message", [(401, "refused the API key (HTTP 401)"), (404, "answered HTTP 404")])
def test_a_misconfigured_judge_stops_the_run_before_any_question(tmp_path, capsys, status, message):
    server = ChatServer(failures=1000, status=status)
    try:
        code = local_evaluation.main(["--data", str(SAMPLE), "--out", str(tmp_path / "run"), "--judge", server.url,
                                      "--judge-model", "judge"])
    finally:
        server.close()
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and message in err and "Traceback" not in err
    assert not (tmp_path / "run" / "predictions.jsonl").exists()  # no question was answered
    assert len(server.requests) == 1  # one probe, not retried


def test_unjudged_predictions_over_the_limit_exit_1_after_the_report(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    record = {"interaction_id": "a", "query": "capital of france?", "answer": "paris", "alt_answers": [],
              "prediction": "Lyon, I believe", "batch_seconds": 1.0, "batch_size": 1}
    write(out / "predictions.jsonl", json.dumps(record) + "\n")
    server = ChatServer()  # echoes the prompt: never a verdict
    try:
        args = ["rejudge", "--data", str(SAMPLE), "--out", str(out), "--judge", server.url, "--judge-model", "j"]
        assert local_evaluation.main(args) == 1
        assert local_evaluation.main([*args, "--max-unjudged", "1"]) == 0
    finally:
        server.close()
    assert "1 predictions unjudged" in capsys.readouterr().err and (out / "report.json").exists()


def test_null_predictions_count_as_i_dont_know():
    records = [{"query": "q", "answer": "paris", "prediction": None}, {"query": "q", "answer": "paris",
                                                                       "prediction": 42}]
    judge_records(records, None)
    assert [(r["verdict"], r["null_prediction"]) for r in records] == [(MISS, True), (MISS, True)]


def test_calibrate_prints_agreement_and_the_confusion_matrix(capsys):
    def careful(body):  # a judge that reads "correct" when the prediction holds the first gold answer's words
        prompt = body["messages"][-1]["content"]
        if "Ground truth answers:" not in prompt:
            return "OK"  # the probe
        gold = prompt.split("Ground truth answers:")[1].split("\n- ")[1].split("\n")[0].lower().split()
        prediction = prompt.split("Prediction:")[1].lower()
        return "Correct." if all(word in prediction for word in gold) else "Incorrect, it differs"
    def unsure_of_partial_answers(word, body):  # P(verdict) 0.6 where some but not all gold words are there
        prompt = body["messages"][-1]["content"]
        gold = prompt.split("Ground truth answers:")[-1].split("\n- ")[-1].split("\n")[0].lower().split()
        partial = 0 < sum(w in prompt.split("Prediction:")[-1].lower() for w in gold) < len(gold)
        return verdict_alternatives(word, body, 0.6 if partial else 0.95)
    server = ChatServer(answer_with=careful, logprobs_with=unsure_of_partial_answers)
    try:
        assert local_evaluation.main(["calibrate", "--judge", server.url, "--judge-model", "careful"]) == 0
    finally:
        server.close()
    out = capsys.readouterr().out
    bands = re.search(r"confident (\d+)% of (\d+)  uncertain (\d+)% of (\d+)", out)
    assert bands and int(bands.group(2)) > 0 and int(bands.group(4)) > 0
    assert "on 45 calibration triples of calibration.jsonl: agreement with the person" in out
    assert "confusion (rows: the person" in out and "organisers' rules with this judge" in out
    agreement = int(out.split("agreement with the person ")[1].split("%")[0])
    assert 60 <= agreement < 100  # a word-matching judge gets most right, and not the lists out of order or refusals
    assert "correct" in out.splitlines()[3] and len(out.splitlines()) >= 7


def test_calibrate_with_a_broken_set_is_one_line(tmp_path, capsys):
    broken = write(tmp_path / "set.jsonl", '{"query": "q", "answer": "a", "prediction": "a", "human": "maybe"}\n')
    assert local_evaluation.main(["calibrate", "--set", str(broken)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "set.jsonl:1: not a calibration row" in err


def test_the_report_counts_why_the_system_said_i_dont_know():
    reasons = ["reasoning: the LLM returned nothing"] * 3 + ["reasoning failed: ValueError: bad shape in q7",
                                                            "reasoning failed: ValueError: bad shape in q9"]
    records = [{"query": "q", "answer": "paris", "prediction": "i don't know", "trace": {"reason": r}}
               for r in reasons]
    records.append({"query": "q", "answer": "paris", "prediction": "i don't know", "timed_out": True})
    records.append({"query": "q", "answer": "paris", "prediction": "Paris"})
    judge_records(records, None)
    summary = score_records(records)
    assert summary["idk_reasons"] == {"reasoning: the LLM returned nothing": 3,
                                      "reasoning failed: ValueError": 2, "the batch ran over its time limit": 1}
    table = format_table(summary)
    assert "why the system said \"i don't know\"" in table and "    3  reasoning: the LLM returned nothing" in table
