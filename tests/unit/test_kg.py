"""The KG stage with a scripted LLM and a recording client: both paths, the checks before any call, rendering."""

import json
from datetime import date

import pytest

from models.config import REPO_ROOT, ConfigError
from models.kg import rows as rows_
from models.kg.client import ENDPOINTS
from models.kg.rows import value as compact
from models.kg.rules import games_date, query_date, question_spans, read_calls, read_entities
from models.llm.backend import STOP
from models.loading import load_config
from models.stages.stage import run_stage
from models.state import QueryState
from models.system import CragSystem
from tests.conftest import stage_of, to_batch, write
from tests.fakes import HashEmbedder, RecordingKG, ScriptedLLM, by_prompt, generated, prompt_name
from utils.llm_json import parse_llm_json
from utils.time_budget import Deadline


def kg_system(make_system, cpu_config, llm, kg, method="rules", task=2):
    cpu_config.task = task
    cpu_config.section("kg").method = method
    return make_system(llm, kg=kg)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += seconds


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


def exact(table):
    """An endpoint of the real server: the value stored under the exact key of the body's "query", else None."""
    return lambda body: table.get(body["query"])


def kg_rows_of(make_system, cpu_config, kg, example, **replies):
    """The KG rows that reached the reasoning prompt for `example`, with the scripted LLM's `replies`."""
    llm = ScriptedLLM(by_prompt(**replies))
    kg_system(make_system, cpu_config, llm, kg, method="functions" if "kg_functions" in replies else "rules"
              ).batch_generate_answer(to_batch([example]))
    reasoning = [c for convs, _ in llm.calls for c in convs if prompt_name(c) == "reasoning"]
    user = reasoning[0][1]["content"] if reasoning else ""
    section = user.split("### Knowledge graph")[1] if "### Knowledge graph" in user else ""
    return [line.removeprefix("- ") for line in section.strip().split("\n\n")[0].splitlines() if line.startswith("- ")]


COMPANIES = ["Meta Materials Inc.", "Meta Platforms, Inc. Class A"]
TICKERS = {"Meta Materials Inc.": "MMAT", "Meta Platforms, Inc. Class A": "META", "Apple Inc.": "AAPL",
           "Apple Hospitality REIT, Inc.": "APLE"}
CAPS = {"MMAT": 130000000.0, "META": 1249000000000.0, "AAPL": 2797000000000.0, "APLE": 3600000000.0}


def finance_kg():
    search = {"meta": COMPANIES, "apple": ["Apple Hospitality REIT, Inc.", "Apple Inc."]}
    return RecordingKG({"finance_get_company_name": lambda body: search.get(body["query"], []),
                        "finance_get_ticker_by_name": exact(TICKERS),
                        "finance_get_info": exact({t: {"longName": n} for n, t in TICKERS.items()}),
                        "finance_get_market_capitalization": exact(CAPS)})


@pytest.mark.parametrize("written, ticker, wrong", [("meta", "META", "MMAT"), ("apple", "AAPL", "APLE")])
def test_a_company_resolves_to_its_ticker_not_the_first_search_hit(make_system, cpu_config, sample_examples,
                                                                   written, ticker, wrong):
    kg = finance_kg()
    example = dict(sample_examples[2], query=f"what's the market cap of {written}?")
    lines = kg_rows_of(make_system, cpu_config, kg, example,
                       kg_entities=entities_reply("finance", company_name=written))
    assert f"{ticker} market capitalization: {compact(CAPS[ticker])}" in lines
    assert all(wrong not in line for line in lines)
    assert not any(body == {"query": written} for name, body in kg.sent if name != "finance_get_company_name")


@pytest.mark.parametrize("method, prompt, reply", [
    ("rules", "kg_entities", entities_reply("finance", company_name="meta")),
    ("functions", "kg_functions", json.dumps([{"function_name": "finance_get_ticker_by_name",
                                               "args": {"company_name": "meta"}}]))])
def test_the_extraction_ends_where_the_model_makes_up_a_next_question(make_system, cpu_config, sample_examples,
                                                                     method, prompt, reply):
    """The served SmolLM2 goes on after its reply with the prompt's framing, a made-up question and its reply, until
    max_tokens: time a batch's KG share cannot spare on 2 cores. The stop ends it at the reply the reader keeps."""
    going_on = reply + "\n\nQuestion: what is the market cap of apple?\nJSON: " + reply * 20
    llm = ScriptedLLM(by_prompt(**{prompt: going_on}))
    example = dict(sample_examples[2], query="what's the market cap of meta?")
    kg_system(make_system, cpu_config, llm, finance_kg(), method=method).batch_generate_answer(to_batch([example]))
    [params] = [params for conversations, params in llm.calls if prompt_name(conversations[0]) == prompt]
    served = generated(going_on, params)
    assert (served.text, served.finish_reason) == (reply, STOP)


@pytest.mark.parametrize("query, spans", [
    ("what's the market cap of meta?", ["market cap", "market", "cap", "meta"]),
    ("did manchester united win last night?", ["manchester united win", "manchester united", "united win"]),
    ("what was the closing price of apple on jan 16 2024?", ["closing price", "closing", "price", "apple"]),
    ("how tall is the eiffel tower?", ["eiffel tower", "tall", "eiffel"]),
])
def test_a_question_s_spans_leave_out_stop_words_and_dates_longest_first(query, spans):
    assert question_spans(query, limit=len(spans)) == spans


@pytest.mark.parametrize("domain, query", [("finance", "what's the market cap of meta?"),
                                           ("open", "what's the market cap of meta?")])
def test_the_spans_path_finds_the_name_without_asking_the_llm(make_system, cpu_config, sample_examples, domain,
                                                            query):
    """Spans are tried longest first until one names what the server stores: "market cap", "market" and "cap" name
    no company, "meta" does (the finance rules); the open domain's search finds nothing for any span."""
    cpu_config.attributes.method = "icl"
    cpu_config.attributes.icl.n = 1
    kg = finance_kg()
    llm = ScriptedLLM(by_prompt(attributes=f"domain: {domain}\ndynamism: static", reasoning=reasoning_from_kg))
    example = dict(sample_examples[2], query=query)
    [answer] = kg_system(make_system, cpu_config, llm, kg, method="spans").batch_generate_answer(to_batch([example]))
    assert not [c for conversations, _ in llm.calls for c in conversations if prompt_name(c).startswith("kg_")]
    searched = [body["query"] for name, body in kg.sent if name in ("finance_get_company_name",
                                                                    "open_search_entity_by_name")]
    looked_up = {body["query"] for name, body in kg.sent if name == "finance_get_market_capitalization"}
    if domain == "finance":
        assert searched == ["market cap", "market", "cap"] and looked_up == {"META"}  # "meta" is a ticker too
        assert answer != "i don't know"
    else:
        assert searched == question_spans(query, cpu_config.section("kg").max_spans) and not looked_up
        assert answer == "i don't know"


def test_kg_calls_the_deadline_leaves_unsent_are_a_cut_of_that_query(make_system, cpu_config, sample_examples):
    """The first span's search takes the KG stage's whole share of the batch: the spans after it are not asked, and
    the query records the cut."""
    clock = Clock()
    kg = finance_kg()
    searching = kg.answers["finance_get_company_name"]
    kg.answers["finance_get_company_name"] = lambda body: (clock.tick(30.0), searching(body))[1]
    cpu_config.attributes.method = "icl"
    cpu_config.attributes.icl.n = 1
    llm = ScriptedLLM(by_prompt(attributes="domain: finance\ndynamism: static"))
    system = kg_system(make_system, cpu_config, llm, kg, method="spans")
    example = dict(sample_examples[2], query="what's the market cap of meta?")
    states = [QueryState(0, "q0", example["query"], example["query_time"], example["search_results"])]
    batch = system.batch(1)
    batch.deadline = Deadline(60.0, clock=clock)
    for name in ("attributes", "kg"):
        run_stage(stage_of(system, name), states, batch)
    searched = [body["query"] for name, body in kg.sent if name == "finance_get_company_name"]
    assert searched == ["market cap"]  # "market", "cap" and "meta" are never asked
    assert states[0].deadline_cuts == ["kg: KG calls left unsent"]


def test_functions_path_resolves_names_and_sends_only_valid_calls(make_system, cpu_config, sample_examples):
    kg = finance_kg()
    reply = json.dumps([{"function_name": "finance_get_market_capitalization", "args": {"ticker_name": "meta"}},
                        {"function_name": "finance_get_eps", "args": {"ticker_name": 42}},
                        {"function_name": "os_system", "args": {"cmd": "rm -rf /"}},
                        {"function_name": "finance_get_market_capitalization", "args": {"ticker_name": "zzzz"}}])
    example = dict(sample_examples[2], query="what's the market cap of meta?")
    lines = kg_rows_of(make_system, cpu_config, kg, example, kg_functions=reply)
    assert lines == ["META market capitalization: 1249000000000"]
    assert ("finance_get_market_capitalization", {"query": "META"}) in kg.sent
    assert ("finance_get_market_capitalization", {"query": "meta"}) not in kg.sent  # never the raw name
    assert not any(body.get("query") == "ZZZZ" for name, body in kg.sent if "market" in name)  # unknown: not made


def test_the_functions_prompt_offers_every_endpoint(make_system, cpu_config, sample_examples):
    llm = ScriptedLLM(by_prompt(kg_functions="[]"))
    kg_system(make_system, cpu_config, llm, RecordingKG({}), method="functions").batch_generate_answer(
        to_batch(sample_examples[:1]))
    functions_prompt = next(c for c, _ in llm.calls if prompt_name(c[0]) == "kg_functions")[0][0]["content"]
    assert all(name in functions_prompt for name in ENDPOINTS)


ARTISTS = {"Taylor Swift": {"birth": "1989-12-13", "count": 9}, "Taylor Swift Tribute Band": {"birth": "2010"}}


def music_kg():
    def search(body):  # BM25 over the words: every name sharing one
        words = set(body["query"].lower().split())
        return [n for n in ARTISTS if words & set(n.lower().split())]
    return RecordingKG({"music_search_artist_entity_by_name": search,
                        "music_get_artist_birth_date": exact({n: a["birth"] for n, a in ARTISTS.items()}),
                        "music_grammy_get_award_count_by_artist": lambda body: ARTISTS.get(body["query"], {})
                        .get("count", 0)})  # the real server counts rows: 0 for a name it does not hold


@pytest.mark.parametrize("method", ["rules", "functions"])
def test_an_artist_is_found_by_search_and_an_unknown_one_is_absent(make_system, cpu_config, sample_examples,
                                                                   method):
    def replies(name):
        if method == "rules":
            return {"kg_entities": entities_reply("music", artist_name=name)}
        return {"kg_functions": json.dumps([{"function_name": "music_grammy_get_award_count_by_artist",
                                             "args": {"artist_name": name}}])}
    known = kg_rows_of(make_system, cpu_config, music_kg(), dict(sample_examples[1], query="how many grammys has "
                       "taylor swift won?"), **replies("taylor swift"))
    assert "Taylor Swift grammy awards won: 9" in known
    kg = music_kg()
    unknown = kg_rows_of(make_system, cpu_config, kg, dict(sample_examples[1], query="how many grammys has taylor "
                         "dayne won?"), **replies("taylor dayne"))
    assert unknown == [] and [name for name, _ in kg.sent] == ["music_search_artist_entity_by_name"]


UTD = "('ENG-Premier League', '2324', 'Manchester Utd', '2024-03-09 Manchester Utd-Everton')"
ARS = "('ENG-Premier League', '2324', 'Arsenal', '2024-03-09 Arsenal-Brentford')"
SOCCER = {"date": {UTD: "2024-03-09T00:00:00.000", ARS: "2024-03-09T00:00:00.000"},
          "opponent": {UTD: "Everton", ARS: "Brentford"}, "result": {UTD: "W", ARS: "W"},
          "GF": {UTD: 2.0, ARS: 2.0}, "GA": {UTD: 0.0, ARS: 1.0}}


def test_a_team_as_questions_write_it_finds_the_organisers_spelling(make_system, cpu_config, sample_examples):
    kg = RecordingKG({"sports_soccer_get_games_on_date": lambda body: SOCCER if body.get("team_name") is None
                      else None})  # the real server filters by its own spelling only
    example = dict(sample_examples[9], query="did manchester united win last night?",
                   query_time="03/10/2024, 08:00:00 PT")
    lines = kg_rows_of(make_system, cpu_config, kg, example,
                       kg_entities=entities_reply("sports", sport="soccer", team="manchester united"))
    assert kg.sent == [("sports_soccer_get_games_on_date", {"date": "2024-03-09"})]
    assert lines == ["soccer 2024-03-09: Manchester Utd vs Everton: W 2-0"]  # the team survives


def test_nba_teams_match_by_their_words_and_bring_the_play_by_play(make_system, cpu_config, sample_examples):
    games = {"team_name_home": {"0": "Los Angeles Lakers", "1": "Boston Celtics"},
             "team_name_away": {"0": "Washington Wizards", "1": "Dallas Mavericks"},
             "pts_home": {"0": 134.0, "1": 138.0}, "pts_away": {"0": 131.0, "1": 110.0},
             "game_id": {"0": "0022300850", "1": "0022300851"}, "game_date": {"0": "2024-02-29 00:00:00",
                                                                             "1": "2024-02-29 00:00:00"}}
    plays = {"game_id": {"0": "0022300850"}, "period": {"0": 1}, "pctimestring": {"0": "11:38"},
             "homedescription": {"0": "Davis 2' Dunk (2 PTS)"}, "player1_name": {"0": "Anthony Davis"}}
    kg = RecordingKG({"sports_nba_get_games_on_date": games, "sports_nba_get_play_by_play_data_by_game_ids": plays})
    example = dict(sample_examples[9], query="who scored first for the lakers on feb 29 2024?")
    lines = kg_rows_of(make_system, cpu_config, kg, example,
                       kg_entities=entities_reply("sports", sport="nba", team="lakers", date="2024-02-29"))
    assert any("Los Angeles Lakers 134 - 131 Washington Wizards" in line for line in lines)
    assert not any("Celtics" in line for line in lines)
    assert ("sports_nba_get_play_by_play_data_by_game_ids", {"game_ids": ["0022300850"]}) in kg.sent
    assert any("Anthony Davis" in line for line in lines)


def test_rows_are_ranked_by_the_question_and_kept_whole_within_the_budget(make_system, cpu_config, sample_examples):
    structured = {f"field_{i}": "x" * 60 for i in range(30)} | {"doctoral_advisor": "Alfred Kleiner"}
    entity = {"summary_text": "Albert Einstein was a physicist. " * 10, "summary_structured": structured,
              "raw_mediawiki": "{{huge}}"}
    kg = RecordingKG({"open_search_entity_by_name": ["Albert Einstein", "Einstein (crater)"],
                      "open_get_entity": exact({"Albert Einstein": entity})})
    cpu_config.section("kg").max_chars = 300
    example = dict(sample_examples[4], query="who was albert einstein's doctoral advisor?")
    lines = kg_rows_of(make_system, cpu_config, kg, example,
                       kg_entities=entities_reply("open", main_entity="albert einstein"))
    assert lines[0] == "Albert Einstein doctoral advisor: Alfred Kleiner"  # the row the question asks for, first
    assert sum(map(len, lines)) <= 300 and set(lines) <= set(rows_.entity_rows("Albert Einstein", entity))
    assert ("open_get_entity", {"query": "Albert Einstein"}) in kg.sent
    assert ("open_get_entity", {"query": "Einstein (crater)"}) not in kg.sent  # the exact name wins alone


def test_rows_rank_by_meaning_words_and_dates_together():
    rows = rows_.as_rows(["Eiffel Tower owner: City of Paris", "Eiffel Tower height: 330 m (1,100 ft)",
                          "Eiffel Tower opening: 31 March 1889"], 0)
    question = "how tall is the eiffel tower?"
    assert rows_.rank(rows, question, set())[0] == rows[0]  # words alone: a tie, kept in arrival order
    ranked = rows_.rank(rows, question, set(), [0.30, 0.62, 0.35])
    assert [row.order for row in ranked] == [1, 2, 0]  # the height row means what the question asks
    dated = rows_.as_rows(["Eiffel Tower opening: 1889-03-31", "Eiffel Tower height: 330 m"], 0)
    assert rows_.rank(dated, question, {"1889-03-31"}, [0.35, 0.62])[0] == dated[0]  # a named date outweighs
    assert rows_.rank(rows, question, set(), [0.30])[0] == rows[0]  # rows without a cosine rank on words


class RecordingEmbedder(HashEmbedder):
    """The hashing embedder, keeping the texts of each encode call."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[list[str]] = []

    def encode(self, texts, deadline=None):
        self.texts.append(list(texts))
        return super().encode(texts, deadline)


def test_a_200_key_infobox_fits_the_budget_with_one_embedding_call_per_batch(cpu_config, sample_examples):
    infobox = {f"field_{i}": f"{{{{convert|{i + 1}|m|ft}}}} and [[Page {i}|value {i}]]" for i in range(197)}
    infobox |= {"image": "Huge.jpg", "caption": "A caption", "height": "{{convert|330|m|ft|abbr=on}}"}
    entities = {"Big Tower": {"summary_text": "Big Tower is a tower. " * 40, "summary_structured": infobox},
                "Small Tower": {"summary_text": "Small Tower is smaller.", "summary_structured": {"height": "12 m"}}}
    kg = RecordingKG({"open_search_entity_by_name": lambda body: [n for n in entities if body["query"] in n.lower()],
                      "open_get_entity": lambda body: entities.get(body["query"])})
    llm = ScriptedLLM(by_prompt(kg_entities=lambda c: entities_reply(
        "open", main_entity="big tower" if "big tower" in c[1]["content"] else "small tower")))
    cpu_config.task, embedder = 2, RecordingEmbedder()
    system = CragSystem(cpu_config, llm=llm, embedder=embedder, given={"kg": kg})
    try:
        questions = ["how tall is the big tower?", "how tall is the small tower?"]
        result = system.answer_batch(to_batch([dict(sample_examples[4], interaction_id=q, query=q)
                                               for q in questions]))
        big, small = (trace["kg_results"] for trace in result.trace)
    finally:
        system.close()
    assert 0 < sum(map(len, big)) <= cpu_config.section("kg").max_chars and not any("{{" in line for line in big)
    assert small == ["Small Tower: Small Tower is smaller.", "Small Tower height: 12 m"]
    with_rows = [texts for texts in embedder.texts if "Small Tower height: 12 m" in texts]
    assert len(with_rows) == 1  # one call for the batch: both questions and every row of both
    assert with_rows[0][:2] == questions and len(with_rows[0]) == 2 + 1 + 197 + 1 + 2


def test_a_named_date_older_than_the_last_days_is_kept(make_system, cpu_config, sample_examples):
    prices = {f"2024-{m:02d}-{d:02d} 00:00:00 EST": {"Open": 100.0 + d, "Close": 101.0 + d}
              for m in (1, 2) for d in range(1, 29)}
    kg = RecordingKG({"finance_get_info": exact({"AAPL": {"longName": "Apple Inc."}}),
                      "finance_get_price_history": exact({"AAPL": prices})})
    cpu_config.section("kg").price_days = 3
    example = dict(sample_examples[2], query="what was the closing price of aapl on jan 16 2024?",
                   query_time="02/27/2024, 09:12:00 PT")
    lines = kg_rows_of(make_system, cpu_config, kg, example, kg_entities=entities_reply("finance", ticker="aapl"))
    days = [line.split(": ")[0][-10:] for line in lines if "daily price" in line]
    assert days[0] == "2024-01-16" and set(days) == {"2024-01-16", "2024-02-25", "2024-02-26", "2024-02-27"}


def test_a_movie_keeps_its_original_title_and_language_and_the_best_title_match(make_system, cpu_config,
                                                                                sample_examples):
    found = [{"title": "Parasite Lost", "original_title": "x"},
             {"title": "Parasite", "original_title": "기생충", "original_language": "ko", "budget": 11363000}]
    kg = RecordingKG({"movie_get_movie_info": found})
    example = dict(sample_examples[0], query="what's the original title of parasite?")
    lines = kg_rows_of(make_system, cpu_config, kg, example, kg_entities=entities_reply("movie", movie_name="parasite"))
    assert lines[0] == "Parasite original title: 기생충" and "Parasite original language: ko" in lines
    assert not any("Parasite Lost" in line for line in lines)


def test_an_embedder_that_fails_leaves_the_rows_ranked_on_words(make_system, cpu_config, sample_examples,
                                                                  caplog_loguru, monkeypatch):
    encode = HashEmbedder.encode

    def fails_on_kg_rows(self, texts, deadline=None):
        return 1 / 0 if any(text.startswith("Berlin leader") for text in texts) else encode(self, texts, deadline)

    monkeypatch.setattr(HashEmbedder, "encode", fails_on_kg_rows)
    lines = kg_rows_of(make_system, cpu_config, RecordingKG.over_fixtures(),
                       dict(sample_examples[4], query="who is the mayor of berlin?"),
                       kg_entities=entities_reply("open", main_entity="berlin"))
    assert lines[0] == "Berlin leader: Governing Mayor: Kai Wegner (CDU)"  # "berlin" and "mayor" both in it
    assert "KG rows: embedding failed (division by zero)" in caplog_loguru.text


def test_year_rows_put_the_asked_award_first_and_winners_before_nominees():
    awards = [{"year_ceremony": 2020, "category": c, "name": f"person {i}", "film": f"film {i}", "winner": i % 2 == 0}
              for i, c in enumerate(["BEST PICTURE", "BEST PICTURE", "DIRECTING", "COSTUME DESIGN", "COSTUME DESIGN"])]
    rows = rows_.as_rows(rows_.year_rows("2020", {"oscar_awards": awards}), 0)
    ranked = rows_.rank(rows, "which film won the oscar for best costume design in 2020?", set())
    assert ranked[0].text == "2020 oscar costume design: person 4 (film 4), won"


def test_year_rows_name_every_winning_film_in_one_row_within_the_budget():
    with open(REPO_ROOT / "data" / "kg" / "movie.json", encoding="utf-8") as f:
        info = json.load(f)["year_db"]["2020"]
    rows = rows_.as_rows(rows_.year_rows("2020", info), 0)
    kept = rows_.fit(rows_.rank(rows, "which movies won an oscar at the 2020 academy awards?", set()), 1000)
    winners = {a["film"] for a in info["oscar_awards"] if a["winner"]}
    assert len(winners) > 10 and sum(len(rows_._oscar(a)) for a in info["oscar_awards"] if a["winner"]) > 1000
    assert all(f"{film} (" in kept[0] for film in winners)
    assert "Parasite (4)" in kept[0]


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
    assert "kg" not in [stage.name for stage in system.pipeline] and system.resource("kg") is None
    system.batch_generate_answer(to_batch(sample_examples[:1]))
    assert all(prompt_name(c[0]) != "kg_entities" for c, _ in llm.calls)


def test_config_checks_task_and_method(tmp_path):
    with pytest.raises(ConfigError, match="'task' is 4; one of"):
        load_config(write(tmp_path / "a.yaml", "task: 4"))
    with pytest.raises(ConfigError, match="'kg.method' is 'magic'; one of"):
        load_config(write(tmp_path / "b.yaml", "kg: {method: magic}"))


def test_values_render_plainly_and_frames_read_in_row_order():
    frame = {"team": {"0": "A", "1": "B", "10": "K"}, "GF": {"0": 1, "1": 2, "10": 3}}
    assert [row for _, row in rows_.frame_rows(frame)] == [{"team": "A", "GF": 1}, {"team": "B", "GF": 2},
                                                          {"team": "K", "GF": 3}]
    assert compact(2797000000000.0) == "2797000000000" and compact(6.4300) == "6.43"
    assert rows_.fit(rows_.as_rows(["a" * 40, "b" * 70, "c" * 40], 0), 100) == ["a" * 40, "c" * 40]
    assert rows_.named_dates("close on jan 16 2024, 2 march and 2024-02-29?", date(2024, 3, 5)) == {
        "2024-01-16", "2024-03-02", "2024-02-29"}


@pytest.mark.parametrize("text, expected", [
    ('```json\n{"a": [1, 2,]}\n```', {"a": [1, 2]}),
    ("{'a': None, 'b': True}", {"a": None, "b": True}),
    ('{"a": "b", "c": {"d": [1, {"e": "f', {"a": "b", "c": {"d": [1, {"e": "f"}]}}),  # cut off mid-output
    ('{"quote": "it}s \\" fine"}', {"quote": 'it}s " fine'}),
    ("[1, 2]", None),  # a list is not the object asked for
])
def test_llm_json_repair(text, expected):
    assert parse_llm_json(text, dict) == expected
