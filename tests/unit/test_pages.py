"""Web page processing: parsing, tables to Markdown, the seed's chunking, the worker pool and the cache."""

import bz2
import json
import multiprocessing.pool
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import utils.web_pages
from tests.conftest import SHARED_CRAG
from utils.chunking import is_question, seed_chunks, split_sentences
from utils.html import decode_html, parse_html, remove_boilerplate, unescape_unicode
from utils.tables import extract_tables
from utils.web_pages import EXTRACTORS, PageProcessor, PageSettings, ProcessedPage, process_html

SETTINGS = PageSettings()
ARTICLE = " ".join(f"The lighthouse keeper number {i} wrote a long report about the storm." for i in range(40))


def tables_of(html: str, name: str = "P", max_chars: int = 4000, max_parts: int = 20) -> list[str]:
    tree = parse_html(html, 1_000_000)
    return extract_tables(tree, name, max_chars, max_parts)


def all_text(page: ProcessedPage) -> str:
    return "\n".join(page.chunks)


# --- parsing -------------------------------------------------------------------------------------------------

def test_boilerplate_is_removed_and_the_text_after_it_kept():
    page = process_html("<html><head><title>T</title><style>p{color:red}</style></head><body>"
                        "<script>var tracker=1;</script>kept tail<div><p>Body text here.</p></div>"
                        "<footer>Copyright foot</footer><button>Click</button></body></html>", "P", SETTINGS)
    text = all_text(page)
    assert "Body text here." in text and "kept tail" in text
    assert "tracker" not in text and "color" not in text and "Copyright" not in text and "Click" not in text


def test_content_nested_into_an_unclosed_button_survives():
    # libxml2 nests everything after an unclosed <button> inside it; the article must not go with it
    html = f"<html><body><button>Menu<div><h1>Storm</h1><p>{ARTICLE}</p></div></body></html>"
    tree = parse_html(html, 1_000_000)
    remove_boilerplate(tree)
    assert "lighthouse keeper number 39" in tree.text_content()


@pytest.mark.parametrize("raw, expected", [
    (b"<p>caf\xc3\xa9</p>", "café"),                                                   # UTF-8
    (b'<meta charset="iso-8859-1"><p>caf\xe9</p>', "café"),                            # declared latin-1
    (b'<meta charset="iso-8859-1"><p>caf\xc3\xa9</p>', "café"),                        # declared wrongly
    (b'<meta charset="no-such-codec"><p>caf\xe9</p>', "café"),                         # unknown codec: cp1252
    ("<p>café</p>".encode("utf-16"), "café"),                                          # BOM
    (b"<p>caf\xe9 \xff</p>", "café ÿ"),                                                # undeclared, not UTF-8
])
def test_encodings(raw, expected):
    assert expected in decode_html(raw)
    assert expected in all_text(process_html(raw, "P", SETTINGS))


def test_escaped_unicode_is_decoded():
    assert unescape_unicode(r"Beyonc\u00e9 \ud83d\ude00 \ud800 \\n") == "Beyoncé \U0001F600 \ufffd \\\\n"
    assert "Beyoncé" in all_text(process_html(r"<p>Beyonc\u00e9 sang.</p>", "P", SETTINGS))


@pytest.mark.parametrize("raw", [None, 42, "", "   ", b"", b"\x00\x01\x02", "<!-- only a comment -->",
                                 "<html></html>", "<script>only()</script>"])
def test_nothing_usable_gives_an_empty_page(raw):
    page = process_html(raw, "P", SETTINGS)
    assert page.chunks == [] and page.tables == []


def test_giant_page_is_cut_not_choked_on():
    page = process_html("<p>" + "word " * 500_000 + "</p>", "P", PageSettings(max_page_chars=10_000))
    assert 0 < len(all_text(page)) <= 10_000


@pytest.mark.parametrize("extractor", EXTRACTORS)
def test_page_where_the_extractor_finds_nothing_falls_back_to_block_text(monkeypatch, extractor):
    if extractor == "trafilatura":
        monkeypatch.setattr(utils.web_pages.trafilatura, "extract", lambda tree, **options: None)
    else:
        monkeypatch.setattr(utils.web_pages, "extract_plain_text", lambda html, **options: "  \n")
    page = process_html("<html><body><nav><a href='/a'>Home</a></nav><div>Opening hours 9 to 5</div>"
                        "<table><tr><th>Day</th></tr><tr><td>Monday</td></tr></table></body></html>", "P",
                        PageSettings(extractor=extractor))
    assert page.source == "fallback" and all_text(page) == "Home Opening hours 9 to 5"
    assert "Monday" in page.tables[0]


@pytest.mark.parametrize("extractor", EXTRACTORS)
def test_article_text_comes_from_the_extractor_without_the_navigation(extractor):
    page = process_html(f"<html><body><nav>Home | News</nav><article><h1>Storm</h1><p>{ARTICLE}</p>"
                        "</article><table><tr><th>Day</th><th>Wind</th></tr><tr><td>Monday</td><td>gale</td></tr>"
                        "</table></body></html>", "P", PageSettings(extractor=extractor))
    text = all_text(page)
    assert page.source == extractor and "lighthouse keeper number 0" in text and "Home" not in text
    assert "gale" not in text and "| Monday | gale |" in page.tables[0]  # a data table is read once, as a table


@pytest.mark.parametrize("extractor", EXTRACTORS)
def test_a_list_of_facts_is_text_and_a_list_of_links_is_not(extractor):
    page = process_html("<html><body><p>The Beatles were a band from Liverpool.</p><h2>Members</h2><ul>"
                        "<li>John Lennon, born 9 October 1940</li><li>Paul McCartney, born 18 June 1942</li></ul>"
                        "<ul><li><a href='/a'>Home</a></li><li><a href='/b'>Contact us</a></li></ul></body></html>",
                        "P", PageSettings(extractor=extractor))
    text = all_text(page)
    assert "John Lennon, born 9 October 1940" in text and "born 18 June 1942" in text
    assert ("Contact us" in text) == (extractor == "trafilatura")  # resiliparse drops a navigation list


def test_the_default_extractor_is_resiliparse_and_an_unknown_one_is_refused():
    assert SETTINGS.extractor == "resiliparse"
    with pytest.raises(ValueError, match="'boilerpipe' is not one of resiliparse, trafilatura"):
        PageSettings(extractor="boilerpipe")


# --- tables --------------------------------------------------------------------------------------------------

def test_table_to_markdown_with_header_separator_and_page_name():
    tables = tables_of("<table><caption>Scores</caption><tr><th>Team</th><th>Goals</th></tr>"
                       "<tr><td>Ajax</td><td>3</td></tr><tr><td>PSV | B</td><td>1</td></tr></table>", "Results")
    assert tables == ["Page name: Results\nTable: Scores\n| Team | Goals |\n| --- | --- |\n| Ajax | 3 |\n"
                      "| PSV \\| B | 1 |"]


def test_colspan_and_rowspan_fill_the_grid():
    tables = tables_of("<table><tr><th colspan=2>Name</th><th>Year</th></tr>"
                       "<tr><td>Ann</td><td>Lee</td><td rowspan=2>1990</td></tr>"
                       "<tr><td>Bob</td><td>Ray</td></tr>"
                       "<tr><td colspan='x'>Cy</td><td>Ito</td><td>2001</td></tr></table>")
    assert tables == ["Page name: P\n| Name | Name | Year |\n| --- | --- | --- |\n| Ann | Lee | 1990 |\n"
                      "| Bob | Ray | 1990 |\n| Cy | Ito | 2001 |"]


def test_absurd_spans_are_capped():
    (table,) = tables_of("<table><tr><td colspan=100000>a</td></tr><tr><td rowspan=999999>b</td></tr></table>")
    assert table.count("| a ") == 20 and table.count("\n") < 10


def test_nested_tables_are_not_duplicated():
    html = ("<table><tr><td>Outer A</td><td>Outer B</td></tr><tr><td>x</td><td>"
            "<table><tr><th>In1</th><th>In2</th></tr><tr><td>i</td><td>j</td></tr></table></td></tr></table>")
    tables = tables_of(html)
    assert len(tables) == 2
    assert sum(t.count("In1") for t in tables) == 1
    assert "| Outer A | Outer B |" in tables[0] and "| In1 | In2 |" in tables[1]


def test_empty_and_layout_tables_are_not_tables_but_their_text_stays():
    html = (f"<table><tr><td> </td></tr><tr><td></td></tr></table>"
            f"<table><tr><td>Only one row</td><td>here</td></tr></table>"
            f"<table><tr><td>Menu</td><td><p>{ARTICLE}</p></td></tr><tr><td>a</td><td>b</td></tr></table>")
    tree = parse_html(html, 1_000_000)
    assert extract_tables(tree, "P", 4000, 20) == []
    assert tree.find(".//table") is None  # unwrapped into blocks, left for the main text
    text = tree.text_content()
    assert "Only one row" in text and "lighthouse keeper number 0" in text and "Menu" in text


def test_tables_leave_the_main_text():
    page = process_html("<p>Intro sentence here.</p><table><tr><th>K</th><th>V</th></tr>"
                        "<tr><td>alpha</td><td>1</td></tr></table>", "P", SETTINGS)
    assert "alpha" in page.tables[0] and "alpha" not in all_text(page)


def test_long_tables_split_between_rows_and_repeat_the_header():
    rows = "".join(f"<tr><td>row {i}</td><td>{i * 7}</td></tr>" for i in range(300))
    parts = tables_of(f"<table><tr><th>Item</th><th>Value</th></tr>{rows}</table>", max_chars=500)
    assert len(parts) > 5 and all(len(p) <= 500 for p in parts)
    assert all(p.startswith("Page name: P\n| Item | Value |\n| --- | --- |\n| row ") for p in parts)
    body = [line for p in parts for line in p.splitlines()[3:]]
    assert body == [f"| row {i} | {i * 7} |" for i in range(300)]  # every row once, none cut


def test_a_row_longer_than_the_cap_is_left_out_whole():
    parts = tables_of(f"<table><tr><th>K</th></tr><tr><td>{'x' * 300}</td></tr><tr><td>short</td></tr></table>",
                      max_chars=100)
    assert parts == ["Page name: P\n| K |\n| --- |\n| short |"]


def test_table_parts_per_page_are_capped():
    table = "<table><tr><th>K</th></tr><tr><td>v</td></tr></table>"
    assert len(tables_of(table * 30, max_parts=7)) == 7


# --- chunking ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sentence, expected", [
    ("What is the capital?", True), ("How tall is it", True), ("Is it open on Sundays", True),
    ("The shop is open.", False), ("It opens at 9?", True), ("“When did it open", True), ("", False),
])
def test_is_question(sentence, expected):
    assert is_question(sentence) is expected


def test_faq_questions_keep_their_answers_and_other_sentences_go_in_threes():
    sentences = split_sentences("The shop opened in 1990. It sells bikes. It has two floors. Parking is free.\n"
                                "How long is the warranty? Two years. It covers parts.\n"
                                "Can I return it? Yes. Within 30 days.")
    assert seed_chunks(sentences, sentence_chars=400, chunk_chars=1000) == [
        "The shop opened in 1990. It sells bikes. It has two floors.", "Parking is free.",
        "How long is the warranty? Two years. It covers parts.",
        "Can I return it? Yes. Within 30 days.",
    ]


def test_question_chunk_stops_at_the_chunk_length_and_sentences_are_truncated():
    chunks = seed_chunks(["What happened?", "a" * 30, "b" * 30, "c" * 30, "d" * 500], sentence_chars=100,
                         chunk_chars=70)
    assert chunks == ["What happened? " + "a" * 30, " ".join(["b" * 30, "c" * 30, "d" * 100])]


# --- property: any bytes are a page --------------------------------------------------------------------------

@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=3000),
                 st.text(max_size=3000),
                 st.lists(st.sampled_from(["<table>", "<tr>", "<td colspan=3>", "<th rowspan=9>", "</td>", "x y. ",
                                           "<p>", "</table>", "<button>", "\\u00e9", "\\ud800", "Why?", "<caption>",
                                           "<script>", "\x00", "<footer>", "<meta charset=utf-16>"]),
                          max_size=60).map("".join)))
def test_any_input_yields_a_page(raw):
    page = process_html(raw, "P", PageSettings(table_chars=200))
    assert isinstance(page.chunks, list) and isinstance(page.tables, list)
    assert all(isinstance(c, str) and c for c in page.chunks + page.tables)
    assert all(len(t) <= 200 for t in page.tables)
    json.dumps(page.chunks + page.tables)  # cacheable: no lone surrogates


# --- processor: cache and pool -------------------------------------------------------------------------------

PAGES = [(f"<p>Page {i} says hello. It has text.</p>", f"name {i}") for i in range(6)]


def test_cache_serves_repeats_and_survives_a_restart(tmp_path):
    first = PageProcessor(SETTINGS, workers=1, cache_folder=tmp_path)
    results = first.process(PAGES + PAGES[:2], timeout_s=30)
    assert [r.chunks for r in results[6:]] == [r.chunks for r in results[:2]]
    assert first.cache.misses == 6  # the repeats within the call were not processed again
    second = PageProcessor(SETTINGS, workers=1, cache_folder=tmp_path)
    again = second.process(PAGES, timeout_s=30)
    assert second.cache.hits == 6 and again == results[:6]


def test_settings_are_part_of_the_cache_key(tmp_path):
    PageProcessor(SETTINGS, workers=1, cache_folder=tmp_path).process(PAGES[:1], timeout_s=30)
    other = PageProcessor(PageSettings(sentence_chars=5), workers=1, cache_folder=tmp_path)
    (page,) = other.process(PAGES[:1], timeout_s=30)
    assert other.cache.misses == 1 and page.chunks == ["Page It ha"]


def test_a_page_cached_by_one_extractor_is_never_served_to_another(tmp_path):
    PageProcessor(PageSettings(extractor="trafilatura"), workers=1, cache_folder=tmp_path).process(
        PAGES[:1], timeout_s=30)
    other = PageProcessor(PageSettings(extractor="resiliparse"), workers=1, cache_folder=tmp_path)
    (page,) = other.process(PAGES[:1], timeout_s=30)
    assert other.cache.misses == 1 and page.source == "resiliparse"


def test_unwritable_cache_folder_is_logged_and_results_still_come(tmp_path, caplog_loguru):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    processor = PageProcessor(SETTINGS, workers=1, cache_folder=blocker / "pages")
    results = processor.process(PAGES, timeout_s=30)
    assert all(r.chunks for r in results) and processor.cache.folder is None
    assert "cannot write the cache" in caplog_loguru.text


def test_pool_gives_the_same_pages_as_one_process():
    pool = PageProcessor(SETTINGS, workers=2, use_cache=False)
    try:
        assert pool.process(PAGES, timeout_s=30) == [process_html(html, name, SETTINGS) for html, name in PAGES]
    finally:
        pool.close()


def _slow_or_broken(raw, name, settings):
    if raw == "STUCK":
        time.sleep(600)  # never finishes: the pool is replaced and its worker killed
    if raw == "BUG":
        raise RuntimeError("parser bug")
    return ProcessedPage(chunks=[f"{raw} ok"])


def test_stuck_page_times_out_and_the_pool_is_replaced(monkeypatch, caplog_loguru):
    monkeypatch.setattr(utils.web_pages, "process_html", _slow_or_broken)  # the forked workers inherit the patch
    delivered = []  # results the parent has received: multiprocessing.pool.ApplyResult._set runs there for each
    receive = multiprocessing.pool.ApplyResult._set

    def counted(result, index, obj):
        receive(result, index, obj)
        delivered.append(index)

    monkeypatch.setattr(multiprocessing.pool.ApplyResult, "_set", counted)

    def clock() -> float:  # the 8 s pass once the three other pages' results are in, however long they took
        return 100.0 if len(delivered) >= 3 else 0.0

    pool = PageProcessor(SETTINGS, workers=2, use_cache=False, clock=clock)
    try:
        results = pool.process([("a", "A"), ("STUCK", "S"), ("BUG", "B"), ("b", "B")], timeout_s=8)
        assert [r.chunks if r else None for r in results] == [["a ok"], None, [], ["b ok"]]
        assert "parser bug" in caplog_loguru.text and "1 of 4 pages not processed" in caplog_loguru.text
        pool.clock = lambda: 0.0
        (later,) = pool.process([("c", "C")], timeout_s=8)  # a fresh pool took over
        assert later.chunks == ["c ok"]
    finally:
        pool.close()


# --- real CRAG pages -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_pages():
    if not SHARED_CRAG.exists():
        pytest.skip("../shared/crag_sample is not present")
    with bz2.open(SHARED_CRAG, "rt", encoding="utf-8") as handle:
        examples = [json.loads(line) for line in handle]
    return [page for example in examples for page in example["search_results"]]


def test_real_pages_all_yield_text(real_pages):
    processed = [process_html(p["page_result"], p["page_name"], SETTINGS) for p in real_pages]
    assert len(processed) == 25
    assert sum(bool(p.chunks) for p in processed) == 25
    assert sum(len(p.tables) for p in processed) >= 10


def test_real_page_nested_in_a_button_keeps_its_article(real_pages):
    (page,) = [p for p in real_pages if p["page_url"].startswith("https://www.lifewire.com/change-language")][:1]
    text = all_text(process_html(page["page_result"], page["page_name"], SETTINGS))
    assert "File > Options" in text and len(text) > 2000


def test_real_language_pack_table_is_markdown(real_pages):
    page = next(p for p in real_pages if "Language Accessory Pack" in p["page_name"])
    tables = process_html(page["page_result"], page["page_name"], SETTINGS).tables
    assert tables[0].startswith(f"Page name: {page['page_name']}\n| Language | Culture (ll-cc) |")
    assert any("| Afrikaans | af-za |" in t for t in tables)
