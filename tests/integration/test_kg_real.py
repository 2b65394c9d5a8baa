"""The KG client against a real server process (evaluation/kg_fixture on a loopback port), and the KG stage end
to end."""

import re
import subprocess
import sys

from models.config import REPO_ROOT
from models.kg.client import ENDPOINTS, KGClient
from models.kg.rules import SEARCHES
from tests.conftest import to_batch
from tests.fakes import HashEmbedder, ScriptedLLM, by_prompt
from tests.servers import free_port  # a port nothing listens on once it returns
from utils.time_budget import Deadline

# One call per endpoint, with arguments the fixtures in data/kg know.
EVERY_CALL = {
    "open_search_entity_by_name": {"query": "eiffel tower"},
    "open_get_entity": {"entity": "Eiffel Tower"},
    "movie_get_person_info": {"person_name": "christopher nolan"},
    "movie_get_movie_info": {"movie_name": "inception"},
    "movie_get_year_info": {"year": "2016"},
    "movie_get_movie_info_by_id": {"movie_id": 27205},
    "movie_get_person_info_by_id": {"person_id": 6193},
    "finance_get_company_name": {"query": "apple"},
    "finance_get_ticker_by_name": {"company_name": "Apple Inc."},
    "finance_get_price_history": {"ticker_name": "AAPL"},
    "finance_get_detailed_price_history": {"ticker_name": "NVDA"},
    "finance_get_dividends_history": {"ticker_name": "MSFT"},
    "finance_get_market_capitalization": {"ticker_name": "AAPL"},
    "finance_get_eps": {"ticker_name": "AAPL"},
    "finance_get_pe_ratio": {"ticker_name": "MSFT"},
    "finance_get_info": {"ticker_name": "NVDA"},
    "music_search_artist_entity_by_name": {"artist_name": "taylor swift"},
    "music_search_song_entity_by_name": {"song_name": "hey jude"},
    "music_get_billboard_rank_date": {"rank": 1, "date": "2024-02-24"},
    "music_get_billboard_attributes": {"date": "2024-03-02", "attribute": "weeks_in_chart",
                                       "song_name": "Texas Hold 'Em"},
    "music_grammy_get_best_artist_by_year": {"year": 2015},
    "music_grammy_get_award_count_by_artist": {"artist_name": "Adele"},
    "music_grammy_get_award_count_by_song": {"song_name": "Rolling in the Deep"},
    "music_grammy_get_best_song_by_year": {"year": 2016},
    "music_grammy_get_award_date_by_artist": {"artist_name": "Taylor Swift"},
    "music_grammy_get_best_album_by_year": {"year": 2016},
    "music_grammy_get_all_awarded_artists": {},
    "music_get_artist_birth_place": {"artist_name": "John Lennon"},
    "music_get_artist_birth_date": {"artist_name": "Paul McCartney"},
    "music_get_members": {"band_name": "The Beatles"},
    "music_get_lifespan": {"artist_name": "George Harrison"},
    "music_get_song_author": {"song_name": "Shake It Off"},
    "music_get_song_release_country": {"song_name": "Hey Jude"},
    "music_get_song_release_date": {"song_name": "Shake It Off"},
    "music_get_artist_all_works": {"artist_name": "Taylor Swift"},
    "sports_soccer_get_games_on_date": {"date": "2018-07-15", "team_name": "France"},
    "sports_nba_get_games_on_date": {"date": "2024-02-29"},
    "sports_nba_get_play_by_play_data_by_game_ids": {"game_ids": ["0022300850"]},
}
SPOT_CHECKS = {
    "open_get_entity": lambda r: r["summary_structured"]["completion_date"] == "{{end date|1889|03|31|df=y}}",
    "movie_get_movie_info": lambda r: r[0]["budget"] == 160000000,
    "finance_get_ticker_by_name": lambda r: r == "AAPL",
    "music_get_billboard_rank_date": lambda r: r == [["Lovin On Me"], ["Jack Harlow"]],
    "music_grammy_get_best_album_by_year": lambda r: r == ["1989"],
    "music_get_members": lambda r: "Ringo Starr" in r,
    # the organisers' soccer frame: the team is part of the row key (league, season, team, game), not a column
    "sports_soccer_get_games_on_date": lambda r: r["GF"] == {
        "('INT-World Cup', '2018', 'France', '2018-07-15 France-Croatia')": 4.0} and "team" not in r,
    "sports_nba_get_play_by_play_data_by_game_ids": lambda r: len(r["game_id"]) == 3,
}


def test_every_endpoint_answers_with_its_type(kg_server):
    assert set(EVERY_CALL) == set(ENDPOINTS)
    client = KGClient(kg_server)
    for name, args in EVERY_CALL.items():
        result = client.call(name, args)
        assert result is not None, name
        assert isinstance(result, ENDPOINTS[name].returns), name
        assert SPOT_CHECKS.get(name, lambda r: True)(result), (name, result)
    assert client.requests_sent == len(EVERY_CALL)


def test_methods_take_positional_and_named_arguments_and_repeat_from_the_cache(kg_server):
    client = KGClient(kg_server)
    assert client.finance_get_eps("AAPL") == client.finance_get_eps(ticker_name="AAPL") == 6.43
    assert client.music_get_billboard_rank_date(2, date="2024-02-24") == [["Texas Hold 'Em"], ["Beyonce"]]
    assert client.requests_sent == 2
    assert client.movie_get_movie_info("no such film at all") == []  # the server's answer: nothing found
    assert client.open_get_entity("Nowhere") is None


def test_a_slow_reply_hits_the_read_timeout(kg_server, caplog_loguru):
    """The server holds a "__slow__" call 3 s (--slow-s 3), six times the read timeout: each attempt times out,
    where a reply (null included) would have ended the call at one request."""
    client = KGClient(kg_server, read_timeout_s=0.5, retries=1, backoff_s=0.05, down_after=3)
    assert client.open_get_entity("__slow__") is None
    assert client.requests_sent == 2 and "open_get_entity (timeout)" in caplog_loguru.text
    assert "after 2 attempt(s)" in caplog_loguru.text and not client.down  # two whole read timeouts of three
    short = Deadline(0.3, clock=lambda: 0.0)  # 0.3 s left to every attempt, however long the call takes
    assert client.open_get_entity("__slow__", deadline=short) is None
    assert client.requests_sent == 4 and not client.down  # reads cut by the deadline are not the server's failures
    assert caplog_loguru.text.count("open_get_entity (timeout)") == 1  # logged once


def test_a_server_that_is_down(caplog_loguru):
    client = KGClient(f"http://127.0.0.1:{free_port()}", retries=2, backoff_s=0.01, down_after=3)
    assert client.finance_get_eps("AAPL") is None and client.finance_get_pe_ratio("AAPL") is None
    assert client.finance_get_market_capitalization("AAPL") is None
    assert client.requests_sent == 9  # three attempts each
    assert client.finance_get_info("AAPL") is None and client.requests_sent == 9  # down now: not even tried
    assert "finance_get_eps (connection)" in caplog_loguru.text and "unreachable 3 times in a row" in caplog_loguru.text


def test_http_503_is_retried_then_given_up_and_500_is_tried_once(kg_server, caplog_loguru):
    client = KGClient(kg_server, retries=2, backoff_s=0.01)
    assert client.music_get_members("__503__") is None
    assert client.requests_sent == 3 and "HTTP 503 after 3 attempt(s)" in caplog_loguru.text
    assert client.open_get_entity("__500__") is None  # the organisers' server raising: the same again
    assert client.requests_sent == 4 and "HTTP 500 (the server cannot use these arguments)" in caplog_loguru.text
    assert client.movie_get_year_info("2023") is None  # a real 500: the Oscar year is out of range
    assert client.requests_sent == 5


def test_invalid_json_and_a_wrong_type_are_none(kg_server, caplog_loguru):
    client = KGClient(kg_server)
    assert client.finance_get_info("__garbage__") is None
    assert client.finance_get_info("__wrongtype__") is None
    assert client.requests_sent == 2  # neither is retried: the server answered
    assert "(invalid JSON)" in caplog_loguru.text and "(wrong type)" in caplog_loguru.text


def reasoning_from_kg(conversation):
    """A careful reader: the answer is the budget given in the knowledge-graph section, else "i don't know"."""
    user = conversation[1]["content"]
    kg = user.split("### Knowledge graph")[1] if "### Knowledge graph" in user else ""
    budget = re.search(r"^- Inception budget: (\d+)$", kg, re.MULTILINE)  # the row of the film, not a guess
    answer = f"${int(budget.group(1)) // 1_000_000} million" if budget else "i don't know"
    return f"===START===\n## Answer: {answer}\n## False Premise: no\n===END==="


def test_a_kg_only_question_is_answered_from_the_kg(kg_server, make_system, cpu_config, sample_examples):
    example = next(e for e in sample_examples if e["query"] == "what was the budget of the movie inception?")
    pages = " ".join(p["page_result"] for p in example["search_results"])
    assert "160" not in pages  # the pages cannot answer it
    extraction = '{"domain": "movie", "entities": {"movie_name": "inception"}}'
    llm = ScriptedLLM(by_prompt(kg_entities=extraction, reasoning=reasoning_from_kg))

    cpu_config.task = 1
    assert make_system(llm).batch_generate_answer(to_batch([example])) == ["i don't know"]

    cpu_config.task = 2
    cpu_config.section("kg").base_url = kg_server
    system = make_system(llm)
    result = system.answer_batch(to_batch([example]))
    assert result.answers == [example["answer"]]
    assert [r["status"] for r in result.trace[0]["stages"] if r["stage"] == "kg"] == ["ok"]


def test_the_kg_server_refuses_a_missing_fixture_folder(tmp_path):
    done = subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "kg_server.py"), "--data", str(tmp_path / "no")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no such fixture folder" in done.stderr


def as_list(result: object) -> list:
    return result if isinstance(result, list) else [result]


def in_question(name: str, question: str) -> bool:
    """Whether a name shares a word of 3 letters or more, other than "the" and "and", with the question (written
    here again, not imported: the test must not share the stage's check)."""
    words = {w for w in re.findall(r"\w+", name.lower()) if len(w) >= 3} - {"the", "and"}
    return bool(words & set(re.findall(r"\w+", question.lower())))


def kg_lines(record: dict) -> list[str]:
    """The knowledge-graph lines of the query's reasoning prompt (recorded with record_prompts on)."""
    user = next(p for p in record["prompts"] if p["prompt"] == "reasoning")["messages"][1]["content"]
    section = user.split("### Knowledge graph")[1].strip().split("\n\n")[0] if "### Knowledge graph" in user else ""
    return [line.removeprefix("- ") for line in section.splitlines() if line.startswith("- ")]


def test_the_real_embedded_llm_s_names_are_checked_before_any_call(kg_server, cpu_config, sample_examples, hf_llm):
    """SmolLM2 writes what it writes (here: the prompt's example names, "apple" and "hey jude", or JSON cut off):
    the kg stage reads it without failing, sends only calls whose names the question holds or the server gave
    back, and the reasoning prompt shows exactly the KG rows the record holds. The batch has time enough for the
    model to write its replies on any machine, so they, not the machine's speed, decide the calls. The functions
    path's checks of a model's output are unit tests (tests/unit/test_kg.py: the endpoint table, name resolution).
    """
    from models.system import CragSystem

    cpu_config.task, cpu_config.section("kg").method, cpu_config.section("kg").base_url = 2, "rules", kg_server
    cpu_config.record_prompts, cpu_config.budget.per_query_s = True, 3600.0
    system = CragSystem(cpu_config, llm=hf_llm, embedder=HashEmbedder())
    try:
        result = system.answer_batch(to_batch(sample_examples[:2]))
    finally:
        system.close()
    server = KGClient(kg_server)
    for example, record in zip(sample_examples[:2], result.trace):
        assert [s["status"] for s in record["stages"] if s["stage"] == "kg"] == ["ok"], record["stages"]
        assert [p["replies"] != [] for p in record["prompts"] if p["prompt"] == "kg_entities"] == [True]
        given = {found for call in record["kg_calls"] if call["call"] in SEARCHES
                 for found in as_list(server.call(call["call"], call["args"]))}
        for call in record["kg_calls"]:
            assert ENDPOINTS[call["call"]].problem(call["args"]) is None, call
            names = [v for k, v in call["args"].items() if isinstance(v, str) and k not in ("date", "attribute")]
            assert all(in_question(v, example["query"]) or v in given for v in names), (example["query"], call)
        assert kg_lines(record) == record["kg_results"]
