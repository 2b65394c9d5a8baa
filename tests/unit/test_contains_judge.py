"""The containment judge: its guards, numbers and dates, its place beside the rules and the organisers' column, the
report's label for its verdicts; the calibration sets' split and join, and what `calibrate` prints."""

import json
import re

import pytest

import local_evaluation
from evaluation.calibration import (
    CALIBRATION_SET,
    GATE_SET,
    figures,
    held_back,
    join_verdicts,
    load_set,
)
from evaluation.choices import JudgeChoice
from evaluation.containment import canonical, contains_gold
from evaluation.data import DataError
from evaluation.judge import ContainsJudge, build_judge, judge_by_containment, judge_records
from evaluation.report import format_table, score_records, write_report
from evaluation.verdicts import CORRECT, MISS, UNJUDGED, WRONG, Item
from tests.conftest import SAMPLE, write
from tools import join_verdicts as join_tool
from utils.answers import contains_answer


@pytest.mark.parametrize("prediction, gold", [
    ("Serena Williams won 23 Grand Slam singles titles.", "23"),
    ("It was Christopher Nolan, in 2010.", "christopher nolan"),
    ("It was directed by Nolan and released in 2010", "nolan"),  # "and" joins clauses, not candidates
    ("Lennon-McCartney, written by Paul McCartney", "paul mccartney"),  # two pieces, no conjunction: no list
    ("It was not Lucas but Nolan", "nolan"),  # the negation is Lucas's
    ("The film \"Jaws\" was released first, not \"Star Wars\".", "jaws"),
    ("London has hosted the Summer Olympics more times than Paris.", "london"),
    ("Of Jaws or Star Wars, Jaws came first", "jaws"),  # one occurrence is hedged, the other is the answer
    ("1989 (her fifth album)", "1989"),
    ("Yes, it supports more languages.", "yes"),
])
def test_a_gold_answer_the_prediction_gives_is_correct(prediction, gold):
    holds, reason = contains_gold(prediction, [gold])
    assert holds, reason


@pytest.mark.parametrize("prediction, gold, guard", [
    ("Nolan, Spielberg and Lucas", "nolan", "list"),
    ("Christopher Nolan and Steven Spielberg", "christopher nolan", "list"),
    ("The directors were Spielberg and Nolan", "nolan", "list"),
    ("Nolan, Spielberg, Lucas", "nolan", "list"),
    ("between 20 and 25", "25", "list"),
    ("It was not Nolan.", "nolan", "negated"),
    ("not Nolan", "nolan", "negated"),
    ("It isn't Nolan", "nolan", "negated"),
    ("It was never Nolan", "nolan", "negated"),
    ("Nolan did not direct it", "nolan", "negated"),
    ("Nolan didn't direct it", "nolan", "negated"),
    ("Nolan is not the director", "nolan", "negated"),
    ("Red or 1989", "1989", "hedged"),
    ("1989 or Red", "1989", "hedged"),
    ("It is either Paris or Lyon", "paris", "hedged"),
    ("Bruce Springsteen is older than Bob Dylan.", "bob dylan", "against"),
    ("more than 23 titles", "23", "against"),
    ("Lyon instead of Paris", "paris", "against"),
])
def test_the_guards_make_an_occurrence_wrong(prediction, gold, guard):
    holds, reason = contains_gold(prediction, [gold])
    assert not holds and guard in reason, reason


@pytest.mark.parametrize("prediction, gold, holds", [
    ("123", "23", False), ("2.3", "23", False), ("23.5 points", "23", False), ("1,230 fans", "230", False),
    ("$183", "$183.63", False), ("$183.63 at the close", "$183", False), ("He scored 23.", "23", True),
    ("160,000,000 dollars", "$160 million", True), ("about $200 million", "$160 million", False),
    ("$1.249 trillion", "1249000000000", True), ("648.1 billion", "$648.1 billion", True),
    ("330 metres", "330 m", True), ("330m", "330 m", True), ("300 meters", "330 m", False),
    ("roughly 126 percent", "126%", True), ("126 per cent", "126%", True),
    ("sixty days", "60", True), ("It won eleven Oscars", "11", True), ("one hundred and sixteen years", "116", True),
    ("twenty-three", "23", True),
    ("31 March 1889", "march 31, 1889", True), ("1889-03-31", "march 31, 1889", True),
    ("on the 31st of March, 1889", "march 31, 1889", True), ("1889", "march 31, 1889", False),
    ("July 2011", "july 23, 2011", False), ("March 31, 1889", "1889", True),
    ("born on July 23, 2011", "23", False),  # a date holds its year, never a day alone
    ("He won it at the 2016 ceremony", "2016", True), ("2015", "2016", False),
])
def test_numbers_units_and_dates(prediction, gold, holds):
    assert contains_gold(prediction, [gold])[0] is holds


def test_number_boundaries_hold_for_contains_answer_too():
    assert not contains_answer("It costs 2.3 dollars", ["2"]) and not contains_answer("in 123 days", ["23"])
    assert contains_answer("It is Paris, of course", ["paris"]) and contains_answer("23, then 24", ["23"])


def test_canonical_forms():
    assert canonical("$160 million, roughly 126 percent, 330 metres") == "160000000, roughly 126%, 330 m"
    assert canonical("2011-07-23") == canonical("July 23, 2011") == "2011_07_23 july 2011"


@pytest.mark.parametrize("prediction, gold, holds, reason", [
    ("blue, red, yellow", "red, yellow and blue", True, "every item"),
    ("Ringo Starr and John Lennon", "john lennon and ringo starr", True, "every item"),
    ("The big three are S&P, Moody's, and Fitch.", "s&p, moody's and fitch", True, "every item"),
    ("red and blue", "red, yellow and blue", False, "only part of the list"),
    ("red, yellow, blue and green", "red, yellow and blue", False, "names 'green' beside the list"),
    ("Thomas Bangalter and Guy-Manuel de Homem-Christo, who met in 1987",
     "thomas bangalter and guy-manuel de homem-christo", True, "every item"),
    ("red, yellow and not blue", "red, yellow and blue", False, "negated"),
])
def test_a_gold_list_needs_every_item_and_no_other(prediction, gold, holds, reason):
    result = contains_gold(prediction, [gold])
    assert result[0] is holds and reason in result[1], result


def test_yes_and_no_must_open_the_prediction():
    assert contains_gold("Yes, it does.", ["yes"])[0] and not contains_gold("No, yes men are rare", ["yes"])[0]
    assert not contains_gold("John Lennon was born first", ["yes"])[0]


def test_an_alternative_answer_counts_and_a_guard_reason_beats_no_match():
    assert contains_gold("It was Coppola", ["francis ford coppola", "coppola"]) == (True, "'coppola' in the prediction")
    assert contains_gold("not Coppola", ["francis ford coppola", "coppola"]) == (False, "'coppola' negated")
    assert contains_gold("Scorsese", ["francis ford coppola"]) == (False, "no gold answer in the prediction")


@pytest.mark.parametrize("prediction, answer, verdict, reason", [
    ("Paris", "paris", CORRECT, "rules"),
    ("I don't know", "paris", MISS, "rules"),
    ("invalid question", "paris", WRONG, "rules"),
    ("The premise is false: paris is no city of his", "invalid question", WRONG,
     "contains: no gold answer in the prediction"),  # a rejected premise: the rules leave it to the judge
    ("It is Paris, of course", "paris", CORRECT, "contains: 'paris' in the prediction"),
    ("It is Lyon", "paris", WRONG, "contains: no gold answer in the prediction"),
])
def test_judge_by_containment_keeps_the_rules_first(prediction, answer, verdict, reason):
    assert judge_by_containment(Item("q", answer, (), prediction)) == (verdict, reason)


def test_the_prediction_is_read_as_the_grader_cuts_it():
    long = "Lyon " + "and more words " * 40 + "but Paris"  # the grader never sees "Paris"
    assert judge_by_containment(Item("q", "paris", (), long))[0] == WRONG


def records():
    return [{"query": "capital of france?", "answer": "paris", "alt_answers": [], "prediction": p, "domain": "open"}
            for p in ("Paris", "It is Paris, of course", "Lyon or Paris", "i don't know", "Lyon")]


def test_its_verdicts_are_judged_by_contains_and_the_organisers_column_stays_as_without_a_judge(tmp_path):
    ours, bare = records(), records()
    judge_records(ours, ContainsJudge())
    judge_records(bare, None)
    assert [(r["verdict"], r["judged_by"]) for r in ours] == [
        (CORRECT, "rules"), (CORRECT, "contains"), (WRONG, "contains"), (MISS, "rules"), (WRONG, "contains")]
    assert ours[2]["judge_reason"] == "contains: 'paris' hedged (or)"
    theirs = [(r["organisers_verdict"], r["organisers_judged_by"]) for r in ours]
    assert theirs == [(r["organisers_verdict"], r["organisers_judged_by"]) for r in bare]
    assert theirs[1] == (UNJUDGED, "none")
    summary = score_records(ours)
    summary["judge"] = "contains"
    assert summary["judged_by"] == {"rules": 2, "contains": 3}
    assert "judged by contains: 3 answers the rules leave open, read by the containment rules" in format_table(summary)
    write_report(summary, ours, tmp_path, "contains")
    assert "Judged by contains: 3 answers" in (tmp_path / "report.md").read_text()
    html = (tmp_path / "report.html").read_text()
    assert "judge contains · judged by rules: 2, contains: 3" in html and "no LLM judge" in html
    judge_records(bare, None)  # the exact rules alone: no note
    assert "judged by contains" not in format_table(score_records(bare))


def test_facts_is_the_default_judge_and_contains_stays_by_name(tmp_path, capsys):
    assert JudgeChoice().spec == "facts" and isinstance(build_judge("contains", None), ContainsJudge)
    out = tmp_path / "run"
    out.mkdir()
    lines = [json.dumps({**r, "interaction_id": str(i), "batch_seconds": 1.0, "batch_size": 1})
             for i, r in enumerate(records())]
    write(out / "predictions.jsonl", "\n".join(lines) + "\n")
    assert local_evaluation.main(["rejudge", "--data", str(SAMPLE), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "judge: facts (no model server" in printed and "corrected for the judge's errors" in printed
    report = json.loads((out / "report.json").read_text())
    assert report["judged_by"] == {"rules": 2, "facts": 3} and report["corrected"]["judged"] == 3
    assert local_evaluation.main(["rejudge", "--data", str(SAMPLE), "--out", str(out), "--judge", "contains"]) == 0
    assert "no calibration set for it (--calibration FILE" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert report["judged_by"] == {"rules": 2, "contains": 3} and report["overall"]["accuracy"] == 0.4
    assert report["organisers"]["overall"]["unjudged"] == 0.6 and "corrected" not in report
    assert local_evaluation.main(["rejudge", "--data", str(SAMPLE), "--out", str(out), "--judge", "rules"]) == 0
    assert json.loads((out / "report.json").read_text())["overall"]["accuracy"] == 0.2


# --- the calibration sets: the split, the join, the figures -------------------------------------------------------

def test_the_split_is_by_question_and_fixed():
    assert held_back("Who directed Inception?") == held_back("  who directed   inception? ")
    rows = load_set(CALIBRATION_SET)
    parts = {held_back(r["query"]) for r in rows if r["query"] == rows[0]["query"]}
    assert len(parts) == 1  # every prediction of one question in the same part
    # the parts of the committed sets: a change of the hash or of the sets shows here
    assert sum(held_back(r["query"]) for r in rows) == 24 and len(rows) == 45
    gate = load_set(GATE_SET)
    assert sum(held_back(r["query"]) for r in gate) == 90 and len(gate) == 199


def test_join_verdicts_adds_the_gold_answers(tmp_path):
    crag = write(tmp_path / "crag.jsonl", json.dumps({"query": "Who directed Jaws?", "answer": "steven spielberg",
                                                      "alternative_answers": ["spielberg"], "question_type": "simple"})
                 + "\n")
    kg = write(tmp_path / "kg.jsonl", json.dumps({"query": "price of apple?", "answer": "186.38",
                                                  "alt_ans": ["$186.38"], "question_type": "simple_w_condition"})
               + "\n" + json.dumps({"query": "who directed jaws?", "answer": "steven spielberg",
                                    "alt_ans": ["spielberg"]}) + "\n")
    verdicts = write(tmp_path / "v.jsonl", json.dumps({"query": "who directed  jaws?", "prediction": "Spielberg did",
                                                       "human": "correct"}) + "\n\n"
                     + json.dumps({"query": "price of apple?", "prediction": "$1", "human": "incorrect"}) + "\n")
    rows = join_verdicts(verdicts, [crag, kg])
    assert [(r["id"], r["kind"], r["answer"], r["alt_answers"], r["human"], r["source"]) for r in rows] == [
        ("gate-01", "simple", "steven spielberg", ["spielberg"], "correct", "crag.jsonl"),
        ("gate-02", "simple_w_condition", "186.38", ["$186.38"], "incorrect", "kg.jsonl")]
    assert rows[0]["query"] == "who directed  jaws?" and rows[0]["prediction"] == "Spielberg did"


@pytest.mark.parametrize("verdict, gold, message", [
    ({"query": "who?", "prediction": "x", "human": "correct"}, [], "'who?' is in none of"),
    ({"query": "q", "prediction": "x", "human": "maybe"}, [{"query": "q", "answer": "a"}], "human must be one of"),
    ({"query": "q", "prediction": "x"}, [{"query": "q", "answer": "a"}], ":1: not a {query, prediction, human}"),
    ({"query": "q", "prediction": "x", "human": "correct"},
     [{"query": "q", "answer": "a"}, {"query": "Q", "answer": "b"}], "with other gold answers"),
])
def test_join_verdicts_names_what_it_cannot_join(tmp_path, verdict, gold, message):
    sources = write(tmp_path / "gold.jsonl", "".join(json.dumps(g) + "\n" for g in gold))
    with pytest.raises(DataError, match=re.escape(message)):
        join_verdicts(write(tmp_path / "v.jsonl", json.dumps(verdict) + "\n"), [sources])


def test_the_committed_gate_set_is_the_join_of_the_verdicts(capsys):
    assert join_tool.main(["--check"]) == 0
    assert {r["human"] for r in load_set(GATE_SET)} == {CORRECT, WRONG}


def test_join_tool_writes_the_set_and_check_finds_a_stale_one(tmp_path, capsys):
    out = tmp_path / "gate.jsonl"
    assert join_tool.main(["--out", str(out)]) == 0
    assert out.read_text() == GATE_SET.read_text()
    write(out, out.read_text().replace('"human": "correct"', '"human": "incorrect"', 1))
    assert join_tool.main(["--out", str(out), "--check"]) == 1
    assert "is out of date: run python tools/join_verdicts.py" in capsys.readouterr().err


def rows_of(people, judged, queries=None):
    return [{"query": q, "human": h, "verdict": v} for h, v, q in zip(people, judged, queries or ["q"] * len(people))]


def test_figures_agreement_recalls_and_kappa():
    # agreement 3/4; the person's correct: 1 of 2 called correct; incorrect: 2 of 2; kappa (0.75 - 0.5) / 0.5
    f = figures(rows_of([CORRECT, CORRECT, WRONG, WRONG], [CORRECT, WRONG, WRONG, WRONG]))
    assert f == {"n": 4, "agreement": 0.75, "recall_correct": 0.5, "recall_incorrect": 1.0, "always_incorrect": 0.5,
                 "kappa": pytest.approx(0.5)}
    # always "incorrect" on a set the person mostly calls incorrect: high agreement, no skill
    always = figures(rows_of([CORRECT] + [WRONG] * 6, [WRONG] * 7))
    assert always["agreement"] == pytest.approx(6 / 7) and always["recall_correct"] == 0.0
    assert always["kappa"] == pytest.approx(0.0, abs=1e-9)
    undefined = figures(rows_of([WRONG, WRONG], [WRONG, WRONG]))
    assert undefined["recall_correct"] is None and undefined["kappa"] is None and undefined["agreement"] == 1.0


def figure_rows(out):
    """{(set, part): (n, agreement, recall correct, recall incorrect, kappa)} from calibrate's figures table (its base
    rate column left out)."""
    found = {}
    for line in out.splitlines():
        match = re.match(r"\s+(\S+(?: sets)?)\s+(held back|all)\s+(\d+)\s+(\S+)\s+\S+\s+(\S+)\s+(\S+)\s+(\S+)$",
                         line)
        if match:
            found[(match.group(1), match.group(2))] = match.groups()[2:]
    return found


def percent(text):
    return int(text.rstrip("%"))


def test_calibrate_prints_the_figures_of_each_set_by_part(capsys):
    assert local_evaluation.main(["calibrate", "--judge", "contains", "--set", str(CALIBRATION_SET), "--set",
                                  str(GATE_SET)]) == 0
    out = capsys.readouterr().out
    assert "judge contains on 45 calibration triples of calibration.jsonl" in out
    assert "judge contains on 199 calibration triples of gate_verdicts.jsonl" in out
    assert "organisers' rules without an LLM judge" in out
    table = figure_rows(out)
    assert set(table) == {(s, p) for s in ("calibration.jsonl", "gate_verdicts.jsonl", "all sets")
                          for p in ("held back", "all")}
    assert [table[("all sets", p)][0] for p in ("held back", "all")] == ["114", "244"]
    n, agreement, correct, incorrect, kappa = table[("all sets", "held back")]
    # the target on the held-back part of both sets; the guards were tuned on the other part only
    assert percent(agreement) >= 85 and percent(correct) >= 75 and percent(incorrect) >= 75 and float(kappa) > 0.6


def test_calibrate_shows_the_rules_alone_have_no_skill_on_sentence_answers(capsys):
    gate = str(GATE_SET)
    assert local_evaluation.main(["calibrate", "--judge", "rules", "--set", gate]) == 0
    table = figure_rows(capsys.readouterr().out)
    assert set(table) == {("gate_verdicts.jsonl", "held back"), ("gate_verdicts.jsonl", "all")}
    assert table[("gate_verdicts.jsonl", "all")] == ("199", "80%", "2%", "100%", "0.04")


def test_the_figures_table_stays_aligned_whatever_a_sets_name():
    from evaluation.calibration import format_figures

    row = {"n": 5, "agreement": 0.8, "recall_correct": 0.5, "recall_incorrect": 1.0, "kappa": 0.6,
           "always_incorrect": 0.6}
    lines = format_figures([("a-very-long-calibration-set-name-of-real-answers.jsonl", {"held back": row}),
                            ("x.jsonl", {"held back, model Llama-3.2-1B-Instruct": row})], "facts").splitlines()
    rows = lines[2:4]
    assert len({line.index("80%") for line in rows}) == 1 and len({len(line) for line in rows}) == 1
    assert lines[1].index("agreement") + len("agreement") == rows[0].index("80%") + len("80%")
