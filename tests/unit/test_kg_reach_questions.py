"""The KG reach benchmark's question file (benchmarks/kg_reach/questions.jsonl): CRAG fields, enough questions per
domain, scripts that name only what the query says, and facts to look for. No server, no model."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from benchmarks.kg_reach import (
    CALL_NAMES,
    DOMAINS,
    ENTITY_NAMES,
    QUESTIONS,
    QuestionError,
    check_questions,
    load_questions,
    named_values,
)
from models.kg.client import ENDPOINTS

CRAG_FIELDS = ("interaction_id", "query", "query_time", "domain", "question_type", "static_or_dynamic", "answer",
               "alt_ans", "search_results")
ENTITY_KEYS = {"company_name", "ticker", "date", "movie_name", "person", "year", "artist_name", "band_name",
               "song_name", "rank", "sport", "team", "main_entity"}  # prompts/kg_entities.yaml


@pytest.fixture(scope="module")
def questions() -> list[dict]:
    return [json.loads(line) for line in QUESTIONS.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_crag_fields_and_counts(questions):
    assert len(questions) >= 40
    for question in questions:
        assert all(key in question for key in (*CRAG_FIELDS, "facts", "script")), question.get("interaction_id")
        assert question["query"] == question["query"].lower()
        assert re.fullmatch(r"\d{2}/\d{2}/\d{4}, \d{2}:\d{2}:\d{2} PT", question["query_time"])
        assert question["search_results"] == [] and isinstance(question["alt_ans"], list)
    per_domain = Counter(q["domain"] for q in questions)
    assert all(per_domain[domain] >= 8 for domain in DOMAINS), per_domain
    assert len({q["interaction_id"] for q in questions}) == len(questions)
    assert len({q["query"] for q in questions}) == len(questions)
    dynamism = Counter(q["static_or_dynamic"] for q in questions)
    assert dynamism["real-time"] + dynamism["fast-changing"] >= 3, "dynamic questions are part of the set"


def test_facts_or_absent(questions):
    for question in questions:
        facts, absent = question["facts"], question.get("absent", [])
        assert facts or absent, question["interaction_id"]
        assert all(isinstance(s, str) and s.strip() for s in facts + absent), question["interaction_id"]
    assert any(q.get("absent") and not q["facts"] for q in questions), "an entity the KG does not hold"


def test_scripts_name_only_what_the_query_says(questions):
    for question in questions:
        script = question["script"]
        assert set(script["entities"]) <= ENTITY_KEYS, question["interaction_id"]
        assert script["entities"] or script["calls"], question["interaction_id"]
        for call in script["calls"]:
            endpoint = ENDPOINTS[call["function_name"]]
            assert endpoint.problem(call["args"]) is None, (question["interaction_id"], call)
        for where, value in named_values(question):
            assert isinstance(value, str) and value in question["query"], (question["interaction_id"], where, value)
        years = [str(script["entities"]["year"])] if "year" in script["entities"] else []
        years += [str(call["args"]["year"]) for call in script["calls"] if "year" in call["args"]]
        assert all(year in question["query"] for year in years), question["interaction_id"]
        for key, value in script["entities"].items():
            if key in ENTITY_NAMES:
                assert value == value.lower(), (question["interaction_id"], key)
        for call in script["calls"]:
            for key, value in call["args"].items():
                if key in CALL_NAMES:
                    assert value == value.lower(), (question["interaction_id"], call)


def test_the_benchmark_accepts_the_file_and_refuses_a_broken_one(questions, tmp_path):
    assert len(load_questions()) == len(questions)
    broken = json.loads(json.dumps(questions[0]))
    broken["script"]["entities"] = {"company_name": "Not In The Query"}
    broken["script"]["calls"] = []
    with pytest.raises(QuestionError, match="not written in the query"):
        check_questions([broken])
    missing = {k: v for k, v in questions[0].items() if k != "query_time"}
    with pytest.raises(QuestionError, match="missing field"):
        check_questions([missing])
    path = tmp_path / "q.jsonl"
    path.write_text("{not json\n", encoding="utf-8")
    with pytest.raises(QuestionError, match="not JSON"):
        load_questions(path)
