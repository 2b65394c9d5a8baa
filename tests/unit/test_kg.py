"""The KG stage with a scripted LLM and a recording client: both paths, the checks before any call, rendering."""

import json
from datetime import date

import pytest

from models.config import ConfigError, load_config
from models.stages.kg import (compact, fit_lines, frame_rows, games_date, query_date, read_calls, read_entities,
                              shrink)
from tests.conftest import to_batch, write
from tests.fakes import ScriptedLLM, by_prompt, prompt_name
from utils.kg_api import ENDPOINTS, KGClient
from utils.llm_json import parse_llm_json


class RecordingKG(KGClient):
    """A client whose server is a dict: records every call that would have been sent."""

    def __init__(self, answers: dict[str, object]) -> None:
        super().__init__("http://unused.invalid")
        self.answers = answers
        self.sent: list[tuple[str, dict]] = []

    def _post(self, endpoint, body, deadline):
        self.sent.append((endpoint.name, body))
        answer = self.answers.get(endpoint.name)
        return True, answer(body) if callable(answer) else answer


def kg_system(make_system, cpu_config, llm, kg, method="rules", task=2):
    cpu_config.task = task
    cpu_config.kg.method = method
    system = make_system(llm)
    system.kg = kg
    return system


PRICES = {f"2024-02-{d:02d} 00:00:00 EST": {"Open": 180.0 + d, "Close": 181.0 + d} for d in range(20, 30)}


def entities_reply(domain, **entities):
    return json.dumps({"domain": domain, "entities": entities})


def reasoning_from_kg(conversation):
    """Answers with the KG line that follows the marker, or "i don't know" without one."""
    user = conversation[1]["content"]
    if "### Knowledge graph" not in user:
        return "===START===\n## Answer: i don't know\n===END==="
    line = user.split("### Knowledge graph")[1].strip().splitlines()[0].removeprefix("- ")
    return f"===START===\n## Answer: {line}\n## False Premise: no\n===END==="


def test_query_time_and_games_dates():
    assert query_date("03/01/2024, 10:00:00 PT") == date(2024, 3, 1)
    assert query_date("2024-02-29T08:00:00") == date(2024, 2, 29)
    assert query_date("13/45/2024, 10:00:00 PT") is None and query_date("") is None
    today = date(2024, 3, 1)
    assert games_date("2023-05-01", "who won last night?", today) == "2024-02-29"  # the relative word wins
    assert games_date(None, "who plays today?", today) == "2024-03-01"
    assert games_date("2018-07-15", "who won the 2018 final?", today) == "2018-07-15"
    assert games_date("July 2018", "who won?", today) == "2024-03"  # malformed: the query's month
    assert games_date(None, "who won?", None) is None


QUESTION = "did france or inception's director win the 2018 final, and what is the xyz ticker?"


@pytest.mark.parametrize("output, expected", [
    ('{"domain": "movie", "entities": {"movie_name": "Inception"}}', ("movie", {"movie_name": "Inception"})),
    ("Sure! {'domain': 'finance', 'entities': {'ticker': 'AAPL',},}", ("finance", {"ticker": "AAPL"})),
    ('{"domain": "cooking", "entities": {"main_entity": "the XYZ", "bad": ["a"], "flag": true}}',
     ("music", {"main_entity": "the XYZ"})),
    ('{"domain": "sports", "entities": {"team": "France", "date": "2018-07-15"', ("sports", {"team": "France",
                                                                                          "date": "2018-07-15"})),
    ('{"domain": "music", "entities": {"song_name": "hey jude", "artist_name": "The Final", "year": "2016"}}',
     ("music", {"artist_name": "The Final", "year": "2016"})),  # a name the question does not hold is dropped
    ("no json here", None),
])
def test_entity_output_is_validated_and_repaired(output, expected):
    assert read_entities(output, "music", QUESTION) == expected  # "music": the attribute predictor's domain


def test_function_calls_are_checked_against_the_endpoint_table():
    output = json.dumps([
        {"function_name": "finance_get_eps", "args": {"ticker_name": "AAPL"}},
        {"function_name": "finance_get_everything", "args": {"ticker_name": "AAPL"}},     # no such endpoint
        {"function_name": "music_grammy_get_best_album_by_year", "args": {"year": "2016"}},  # str for int
        {"function_name": "movie_get_movie_info", "args": {"title": "Inception"}},         # wrong argument name
        {"function_name": "music_get_billboard_rank_date", "args": {"rank": 1}},          # optional date left out
        "finance_get_pe_ratio",
        {"function_name": "finance_get_pe_ratio", "args": {"ticker_name": "AAPL"}},       # over the limit of 2
    ])
    calls, refused = read_calls(output, max_calls=2)
    assert calls == [("finance_get_eps", {"ticker_name": "AAPL"}), ("music_get_billboard_rank_date", {"rank": 1})]
    assert len(refused) == 5
    assert any("unknown function" in r for r in refused) and any("must be int" in r for r in refused)
    assert any("unknown argument(s) ['title']" in r for r in refused) and any("over the limit" in r for r in refused)
    assert read_calls("I would call finance_get_eps", 3) == ([], ["no JSON list of calls in the output"])


def test_functions_path_sends_only_the_valid_calls(make_system, cpu_config, sample_examples):
    kg = RecordingKG({"finance_get_eps": 6.43, "finance_get_pe_ratio": 28.1})
    reply = json.dumps([{"function_name": "finance_get_eps", "args": {"ticker_name": "AAPL"}},
                        {"function_name": "finance_get_eps", "args": {"ticker_name": 42}},
                        {"function_name": "os_system", "args": {"cmd": "rm -rf /"}},
                        {"function_name": "finance_get_pe_ratio", "args": {"ticker_name": "AAPL"}}])
    llm = ScriptedLLM(by_prompt(kg_functions=reply, reasoning=reasoning_from_kg))
    system = kg_system(make_system, cpu_config, llm, kg, method="functions")
    answers = system.batch_generate_answer(to_batch(sample_examples[2:3]))
    assert kg.sent == [("finance_get_eps", {"query": "AAPL"}), ("finance_get_pe_ratio", {"query": "AAPL"})]
    assert answers == ["finance_get_eps(ticker_name='AAPL'): 6.43"]  # the KG line reached the reasoning prompt
    functions_prompt = next(c for c, _ in llm.calls if prompt_name(c[0]) == "kg_functions")[0][0]["content"]
    assert all(name in functions_prompt for name in ENDPOINTS)  # every endpoint is offered


def test_rules_resolve_a_company_to_its_ticker_and_keep_prices_up_to_the_query_date(make_system, cpu_config,
                                                                                     sample_examples):
    kg = RecordingKG({"finance_get_ticker_by_name": lambda body: None,
                      "finance_get_company_name": ["Apple Inc."],
                      "finance_get_price_history": PRICES, "finance_get_eps": 6.43})
    kg.answers["finance_get_ticker_by_name"] = lambda body: "AAPL" if body["query"] == "Apple Inc." else None
    llm = ScriptedLLM(by_prompt(kg_entities=entities_reply("finance", company_name="apple"),
                                reasoning=reasoning_from_kg))
    system = kg_system(make_system, cpu_config, llm, kg)
    cpu_config.kg.price_days = 3
    example = dict(sample_examples[2], query_time="02/27/2024, 09:12:00 PT")
    states = []
    original = system.strategy.stages[-1].run
    system.strategy.stages[-1].run = lambda batch, ctx: (states.extend(batch), original(batch, ctx))[1]
    system.batch_generate_answer(to_batch([example]))
    sent = [name for name, _ in kg.sent]
    assert sent[:3] == ["finance_get_ticker_by_name", "finance_get_company_name", "finance_get_ticker_by_name"]
    assert set(sent[3:]) == {"finance_get_price_history", "finance_get_market_capitalization", "finance_get_eps",
                             "finance_get_pe_ratio", "finance_get_dividends_history", "finance_get_info"}
    prices = next(line for line in states[0].kg_results if line.startswith("finance_get_price_history"))
    assert "2024-02-27" in prices and "2024-02-25" in prices and "2024-02-24" not in prices
    assert "2024-02-28" not in prices  # after the question's date
    assert "finance_get_eps(ticker_name='AAPL'): 6.43" in states[0].kg_results


def test_rules_for_sports_take_last_night_from_the_query_time(make_system, cpu_config, sample_examples):
    frame = {"team": {"0": "France"}, "opponent": {"0": "Croatia"}, "result": {"0": "W"}}
    kg = RecordingKG({"sports_soccer_get_games_on_date": frame})
    llm = ScriptedLLM(by_prompt(kg_entities=entities_reply("sports", sport="soccer", team="France", date="1999-01-01")))
    example = dict(sample_examples[9], query="did france win last night?", query_time="07/16/2018, 08:00:00 PT")
    kg_system(make_system, cpu_config, llm, kg).batch_generate_answer(to_batch([example]))
    assert kg.sent == [("sports_soccer_get_games_on_date", {"date": "2018-07-15", "team_name": "France"})]


def test_rules_for_open_search_then_read_the_best_match(make_system, cpu_config, sample_examples):
    entity = {"summary_text": "A tower." * 200, "summary_structured": {"completed": "31 March 1889"},
              "raw_mediawiki": "{{huge}}"}
    kg = RecordingKG({"open_search_entity_by_name": ["Eiffel Tower", "Eiffel"], "open_get_entity": entity})
    llm = ScriptedLLM(by_prompt(kg_entities=entities_reply("open", main_entity="eiffel tower")))
    system = kg_system(make_system, cpu_config, llm, kg)
    cpu_config.kg.max_chars = 300
    system.batch_generate_answer(to_batch(sample_examples[4:5]))
    assert kg.sent == [("open_search_entity_by_name", {"query": "eiffel tower"}),
                       ("open_get_entity", {"query": "Eiffel Tower"})]


def test_unreadable_extraction_means_no_lookup_for_that_query_only(make_system, cpu_config, sample_examples):
    kg = RecordingKG({"movie_get_movie_info": [{"title": "Inception", "budget": 160000000}]})

    def extraction(conversation):
        if "inception" in conversation[1]["content"]:
            return entities_reply("movie", movie_name="Inception")
        return "I think this is about music."

    llm = ScriptedLLM(by_prompt(kg_entities=extraction))
    kg_system(make_system, cpu_config, llm, kg).batch_generate_answer(to_batch(sample_examples[:2]))
    assert kg.sent == [("movie_get_movie_info", {"query": "Inception"})]


def test_task_1_never_calls_the_kg(make_system, cpu_config, sample_examples):
    llm = ScriptedLLM()
    system = kg_system(make_system, cpu_config, llm, None, task=1)
    assert "kg" not in [stage.name for stage in system.strategy.stages] and system.kg is None
    system.batch_generate_answer(to_batch(sample_examples[:1]))
    assert all(prompt_name(c[0]) != "kg_entities" for c, _ in llm.calls)


def test_config_checks_task_and_method(tmp_path):
    with pytest.raises(ConfigError, match="task must be 1, 2 or 3"):
        load_config(write(tmp_path / "a.yaml", "task: 4"))
    with pytest.raises(ConfigError, match="kg.method 'magic'"):
        load_config(write(tmp_path / "b.yaml", "kg: {method: magic}"))


def test_shrink_keeps_what_answers_questions():
    movie = [{"title": "Inception", "budget": 160000000, "release_date": "2010-07-15",
              "crew": [{"name": "Christopher Nolan", "job": "Director"}, {"name": "Hans Zimmer", "job": "Composer"}],
              "cast": [{"name": f"Actor {i}", "character": f"Role {i}"} for i in range(9)],
              "oscar_awards": [{"year_ceremony": 2011, "category": "CINEMATOGRAPHY", "name": "Wally Pfister",
                                "film": "Inception", "winner": True}]}, {"title": "Other"}]
    shown = compact(shrink("movie_get_movie_info", movie, None, 5))
    assert "budget: 160000000" in shown and "directors: Christopher Nolan" in shown and "Hans Zimmer" not in shown
    assert "Actor 4 as Role 4" in shown and "Actor 5" not in shown and "Other" not in shown
    assert "2011 CINEMATOGRAPHY: Wally Pfister (Inception, won)" in shown
    assert "raw" not in compact(shrink("open_get_entity", {"summary_text": "s", "raw_mediawiki": "raw"}, None, 5))
    frame = {"team": {"0": "A", "1": "B", "10": "K"}, "GF": {"0": 1, "1": 2, "10": 3}}
    assert frame_rows(frame) == [{"team": "A", "GF": 1}, {"team": "B", "GF": 2}, {"team": "K", "GF": 3}]
    assert compact(2797000000000.0) == "2797000000000" and compact(6.4300) == "6.43"
    assert compact(list(range(25))).endswith("(and 5 more)")


def test_fit_lines_keeps_whole_lines_within_the_budget():
    assert fit_lines(["a" * 40, "b" * 40, "c" * 40], 100) == ["a" * 40, "b" * 40]
    assert fit_lines(["x" * 500], 100) == ["x" * 99 + "…"]
    assert fit_lines([], 100) == []


@pytest.mark.parametrize("text, expected", [
    ('```json\n{"a": [1, 2,]}\n```', {"a": [1, 2]}),
    ("{'a': None, 'b': True}", {"a": None, "b": True}),
    ('{"a": "b", "c": {"d": [1, {"e": "f', {"a": "b", "c": {"d": [1, {"e": "f"}]}}),  # cut off mid-output
    ('{"quote": "it}s \\" fine"}', {"quote": 'it}s " fine'}),
    ("[1, 2]", None),  # a list is not the object asked for
])
def test_llm_json_repair(text, expected):
    assert parse_llm_json(text, dict) == expected
