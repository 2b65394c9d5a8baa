"""The references stage: candidates from pages, ranking, the table budget, the re-ranker switch, bad pages."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.retrieval.dense import select
from models.stages.references import ReferencesStage, shortlist
from models.stages.stage import run_alone
from models.state import QueryState, Reference
from tests.fakes import HashEmbedder, ScriptedLLM
from utils.web_pages import PageProcessor, PageSettings

CALENDAR = ("<p>2024 has 366 days because it is a leap year.</p><p>Every month has a name.</p>"
            "<table><tr><th>Month</th><th>Days</th></tr><tr><td>February</td><td>29</td></tr>"
            "<tr><td>April</td><td>30</td></tr></table>")
WEATHER = "<p>Rain is expected on Tuesday. Wind from the west.</p>"


def page(html, name="Calendar 2024", url="https://example.org/cal", modified="2024-01-02", snippet=""):
    return {"page_result": html, "page_name": name, "page_url": url, "page_last_modified": modified,
            "page_snippet": snippet}


def run(states, config, reranker=None):
    processor = PageProcessor(PageSettings.from_config(config.references), workers=1)
    resources = {"llm": ScriptedLLM(), "embedder": HashEmbedder(), "pages": processor, "reranker": reranker}
    run_alone(ReferencesStage(), states, config, resources, seconds=60)
    return states


def state(query, *pages, index=0):
    return QueryState(index, f"q{index}", query, "", list(pages))


def test_chunks_tables_and_snippets_keep_their_page(cpu_config):
    (s,) = run([state("how many days does february 2024 have", page(CALENDAR, snippet="Days of 2024"),
                      page(WEATHER, name="Weather", url="https://example.org/w"))], cpu_config)
    kinds = {ref.kind for ref in s.references}
    assert kinds == {"chunk", "table", "snippet"}
    table = next(ref for ref in s.references if ref.kind == "table")
    assert table.text.startswith("Page name: Calendar 2024\n| Month | Days |")
    assert (table.page_name, table.page_url, table.page_last_modified) == (
        "Calendar 2024", "https://example.org/cal", "2024-01-02")
    assert [ref.score for ref in s.references] == sorted((ref.score for ref in s.references), reverse=True)


def test_queries_get_their_own_pages_only(cpu_config):
    states = run([state("leap year days", page(CALENDAR)),
                  state("rain on tuesday", page(WEATHER, name="Weather"), index=1)], cpu_config)
    assert {ref.page_name for ref in states[0].references} == {"Calendar 2024"}
    assert {ref.page_name for ref in states[1].references} == {"Weather"}


def test_no_usable_text_leaves_the_query_open_for_the_kg(cpu_config):
    cpu_config.references.use_snippets = False
    (s,) = run([state("anything", page("<script>x()</script>"), page(None), {"page_result": 42})], cpu_config)
    assert s.references == [] and not s.done  # the KG may still answer; the evidence check decides after it


def test_select_keeps_top_k_texts_and_tables_within_the_budget():
    refs = [Reference("a" * 10, "chunk"), Reference("t" * 60, "table"), Reference("b" * 10, "chunk"),
            Reference("u" * 50, "table"), Reference("c" * 10, "snippet"), Reference("v" * 30, "table")]
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4], dtype=np.float32)
    chosen = select(refs, scores, k=2, table_budget_chars=95)
    assert [refs[i].text[0] for i in chosen] == ["a", "t", "b", "v"]  # "u" does not fit after "t"; "v" does
    assert select(refs, scores, k=0, table_budget_chars=0) == []


class KeywordReranker:
    """Scores by whether the text holds a keyword; records what it was asked to score."""

    def __init__(self, keyword):
        self.keyword = keyword
        self.seen = []

    def score(self, query, texts):
        self.seen.append(list(texts))
        return np.array([float(self.keyword in text) for text in texts], dtype=np.float32)


def test_reranker_reorders_the_shortlist(cpu_config):
    cpu_config.references.table_budget_chars = 0
    cpu_config.references.use_snippets = False
    facts = " ".join(f"Fact number {i} about leap years." for i in range(9))
    pages = [page(f"<p>{facts}</p>"), page("<p>Wind is west.</p>", name="Weather")]
    by_cosine = run([state("facts about leap years", *pages)], cpu_config)[0].references
    assert by_cosine[-1].text == "Wind is west."  # cosine ranks it last

    reranker = KeywordReranker("Wind")
    (s,) = run([state("facts about leap years", *pages)], cpu_config, reranker)
    assert s.references[0].text == "Wind is west." and len(reranker.seen[0]) == 4

    cpu_config.references.rerank.candidates = 2
    reranker = KeywordReranker("Wind")
    (s,) = run([state("facts about leap years", *pages)], cpu_config, reranker)
    assert len(reranker.seen[0]) == 2 and "Wind is west." not in [r.text for r in s.references]


@pytest.mark.parametrize("reranked", [False, True])
def test_embeddings_follow_the_kept_references(cpu_config, reranked):
    cpu_config.references.rerank.candidates = 3
    (s,) = run([state("how many days has february in 2024?", page(CALENDAR), page(WEATHER, name="Weather"))],
               cpu_config, KeywordReranker("Wind") if reranked else None)
    assert len(s.references) == len(s.reference_vectors) > 1
    np.testing.assert_allclose(s.query_vector, HashEmbedder().encode([s.query])[0])
    np.testing.assert_allclose(s.reference_vectors, HashEmbedder().encode([r.text for r in s.references]), atol=1e-6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.binary(max_size=2000), st.text(max_size=2000), st.none(), st.integers()),
                max_size=5))
def test_any_pages_yield_a_list_of_references_and_never_an_answer(cpu_config, pages):
    (s,) = run([state("what is it", *[page(raw) for raw in pages])], cpu_config)
    assert isinstance(s.references, list) and not s.done


@pytest.mark.parametrize("field", ["page_name", "page_url", "page_last_modified", "page_snippet"])
def test_missing_or_odd_metadata_is_tolerated(cpu_config, field):
    broken = page(CALENDAR)
    broken[field] = None if field != "page_url" else 12
    (s,) = run([state("days in february", broken)], cpu_config)
    assert s.references and all(isinstance(r.page_name, str) for r in s.references)


def test_reranker_without_a_local_folder_is_refused(tmp_path):
    from models.config import RerankConfig
    from models.llm.backend import BackendUnavailable
    from models.retrieval.reranker import Reranker

    with pytest.raises(BackendUnavailable, match="not a local model folder"):
        Reranker(RerankConfig(model=str(tmp_path / "missing")))
    with pytest.raises(BackendUnavailable, match="not set"):
        Reranker(RerankConfig(model=None))


def test_a_huge_page_is_shortlisted_by_bm25_before_embedding(cpu_config):
    """3,000 chunks of one page: only max_candidates are embedded, and the one that answers is among them."""
    filler = "".join(f"<p>Paragraph {i}: the harbour handled {i * 7} vessels at quay {i % 9} during week {i}.</p>"
                     for i in range(3000))
    answer = "<p>The lighthouse keeper of the harbour was Margaret Ellison from 1931.</p>"
    cpu_config.references.max_candidates = 40
    cpu_config.references.chunk_chars = 120
    (s,) = run(
        [state("who was the lighthouse keeper of the harbour", page(filler[:150_000] + answer + filler[150_000:]))],
        cpu_config,
    )
    assert len(s.candidates) <= 40 and len(s.candidate_vectors) == len(s.candidates)
    assert "Margaret Ellison" in s.references[0].text


def test_embedding_stops_at_the_deadline_and_leaves_every_query_its_best_candidates():
    from models.stages.references import embed_in_turn

    class Slow:  # embeds only the first `rows` texts, as Embedder.encode does when its deadline passes
        def __init__(self, rows):
            self.rows = rows

        def encode(self, texts, deadline=None):
            return HashEmbedder().encode(texts[:self.rows])

    per_query = [[Reference(f"a{i}", "chunk") for i in range(5)], [Reference(f"b{i}", "chunk") for i in range(2)],
                 [Reference(f"c{i}", "chunk") for i in range(4)]]
    blocks = embed_in_turn(Slow(7), per_query, deadline=None)
    assert [len(b) for b in blocks] == [3, 2, 2]  # in turns: a0 b0 c0 a1 b1 c1 a2
    assert np.allclose(blocks[0][2], HashEmbedder().encode(["a2"])[0])
    assert [len(b) for b in embed_in_turn(Slow(0), per_query, deadline=None)] == [0, 0, 0]


class Unfinished(PageProcessor):
    """The page processor, answering None for the pages named in `late`: what `PageProcessor.process` returns for a
    page not finished within its timeout."""

    def __init__(self, settings, late):
        super().__init__(settings, workers=1)
        self.late = late

    def process(self, pages, timeout_s):
        done = super().process(pages, timeout_s)
        return [None if name in self.late else result for (_, name), result in zip(pages, done)]


class FirstRows(HashEmbedder):
    """Embeds the candidates' call only up to `rows` texts, as Embedder.encode does once its deadline passes (the
    queries' call, which has no deadline, whole)."""

    def __init__(self, rows):
        super().__init__()
        self.rows = rows

    def encode(self, texts, deadline=None):
        return super().encode(texts if deadline is None else texts[:self.rows])


def test_the_deadline_s_cuts_of_pages_and_embeddings_are_recorded_on_the_queries_they_cut(cpu_config):
    processor = Unfinished(PageSettings.from_config(cpu_config.references), late={"Weather"})
    states = [state("how many days does february 2024 have", page(CALENDAR),
                    page(WEATHER, name="Weather", url="https://example.org/w")),
              state("rain on tuesday", page(WEATHER, name="Forecast"), index=1)]
    resources = {"llm": ScriptedLLM(), "embedder": FirstRows(2), "pages": processor, "reranker": None}
    run_alone(ReferencesStage(), states, cpu_config, resources, seconds=60)
    assert states[0].deadline_cuts == ["references: pages left unparsed", "references: candidates left unembedded"]
    assert states[1].deadline_cuts == []  # its one candidate was embedded in the first turn
    assert len(states[0].candidates) == 1 and len(states[1].candidates) == 1


def test_a_snippet_is_embedded_with_its_title_and_a_known_vector_is_not_embedded_again():
    from models.stages.references import embed_in_turn

    embedder = CountingTexts()
    snippet = Reference("Opening hours 9 to 5", "snippet", "Museum")
    known = {"Museum Opening hours 9 to 5": np.ones(512, dtype=np.float32)}
    (block,) = embed_in_turn(embedder, [[Reference("a chunk", "chunk"), snippet]], None, known)
    assert embedder.texts == ["a chunk"] and np.array_equal(block[1], known["Museum Opening hours 9 to 5"])
    (block,) = embed_in_turn(embedder, [[snippet]], None)
    assert embedder.texts[-1] == "Museum Opening hours 9 to 5"


class CountingTexts(HashEmbedder):
    def __init__(self):
        super().__init__()
        self.texts: list[str] = []

    def encode(self, texts, deadline=None):
        self.texts += texts
        return super().encode(texts, deadline)


def test_the_shortlist_scores_whole_words():
    """A candidate with the query's letters but not its word ("act tac" for "cat") scores nothing."""
    texts = ("act tac", "a dog runs", "birds fly south", "fish swim", "a tall cat sat there on the mat")
    refs = [Reference(text, "chunk", "P", "", "") for text in texts]
    assert [r.text for r in shortlist("cat", refs, 1)] == ["a tall cat sat there on the mat"]


class CountingPages(PageProcessor):
    """The page processor, recording which pages it was asked to parse."""

    def __init__(self, settings):
        super().__init__(settings, workers=1)
        self.asked: list[str] = []

    def process(self, pages, timeout_s):
        self.asked += [name for _, name in pages]
        return super().process(pages, timeout_s)


def test_a_query_with_more_pages_than_max_pages_reads_the_best_by_title_and_snippet(cpu_config):
    cpu_config.references.max_pages = 2
    topics = ["harbour ferries", "mountain goats", "leap year days", "opera singers", "desert winds", "jazz clubs"]
    many = [page(f"<p>All about {topic}. It is a long page about {topic}.</p>", name=f"Guide to {topic}",
                 snippet=f"Read about {topic} here") for topic in topics]
    few = [page(WEATHER, name="Weather", snippet="rain on tuesday")]
    processor, embedder = CountingPages(PageSettings.from_config(cpu_config.references)), HashEmbedder()
    states = [state("how many leap year days", *many), state("rain on tuesday", *few, index=1)]
    resources = {"llm": ScriptedLLM(), "embedder": embedder, "pages": processor, "reranker": None}
    run_alone(ReferencesStage(), states, cpu_config, resources, seconds=60)
    read = set(processor.asked)
    assert "Guide to leap year days" in read and "Weather" in read and len(read) == 3
    kinds = {(ref.page_name, ref.kind) for ref in states[0].candidates}
    assert ("Guide to leap year days", "chunk") in kinds
    assert ("Guide to jazz clubs", "snippet") in kinds and ("Guide to jazz clubs", "chunk") not in kinds
    assert embedder.calls == 2  # queries with page headers, then the candidates


def test_max_pages_zero_reads_every_page(cpu_config):
    cpu_config.references.max_pages = 0
    pages = [page(f"<p>Page {i} text.</p>", name=f"P{i}") for i in range(7)]
    processor = CountingPages(PageSettings.from_config(cpu_config.references))
    resources = {"llm": ScriptedLLM(), "embedder": HashEmbedder(), "pages": processor, "reranker": None}
    run_alone(ReferencesStage(), [state("page text", *pages)], cpu_config, resources, seconds=60)
    assert sorted(processor.asked) == [f"P{i}" for i in range(7)]


def test_candidates_whose_vectors_are_known_pass_the_shortlist_without_counting():
    texts = ("act tac", "a dog runs", "birds fly south", "fish swim", "a tall cat sat there on the mat")
    refs = [Reference(text, "chunk", "P", "", "") for text in texts] + [Reference("cats nap", "snippet", "Pets")]
    kept = shortlist("cat", refs, 1, known={"Pets cats nap"})
    assert [r.text for r in kept] == ["cats nap", "a tall cat sat there on the mat"]


def test_the_candidates_to_embed_are_capped_per_page_read(cpu_config):
    from models.stages.references import candidate_limit

    settings = cpu_config.references
    settings.max_candidates, settings.candidates_per_page = 500, 0
    assert candidate_limit(settings, 5) == 500
    settings.candidates_per_page = 10
    assert (candidate_limit(settings, 5), candidate_limit(settings, 20), candidate_limit(settings, 0)) == (50, 200, 1)
    settings.max_candidates = 120
    assert candidate_limit(settings, 20) == 120
