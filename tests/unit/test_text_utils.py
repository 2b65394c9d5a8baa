import pytest

from utils.answers import IDK, final_answer, is_idk, normalize_text, trim_to_tokens
from utils.chunking import group_sentences, split_sentences
from utils.html import parse_html, visible_text
from utils.pages import page_text


def text_of(raw, max_chars=1_000_000):
    tree = parse_html(raw, max_chars)
    return None if tree is None else visible_text(tree)


def test_visible_text_drops_scripts_styles_and_keeps_blocks():
    html = ("<html><head><title>T</title><style>p{}</style></head><body><script>var x=1;</script>"
            "<div>one<p>two</p></div><footer>foot</footer><button>b</button><!-- c --></body></html>")
    assert text_of(html) == "one\ntwo"


@pytest.mark.parametrize("raw", [None, 42, "", "   ", b""])
def test_nothing_to_parse_gives_none(raw):
    assert parse_html(raw, 100) is None


def test_broken_markup_bytes_and_declared_encodings_are_read():
    assert "ok" in text_of("<div><p>ok<table><tr><td>cell")
    assert text_of(b"<p>caf\xe9 \xff</p>") == "caf\ufffd \ufffd"
    assert text_of('<?xml version="1.0" encoding="latin-1"?><p>x</p>') == "x"


def test_giant_page_is_cut_not_choked_on():
    text = text_of("<p>" + "word " * 500_000 + "</p>", max_chars=10_000)
    assert 0 < len(text) <= 10_000


def test_sentences_and_chunks_are_bounded():
    sentences = split_sentences("First one here. Second one there.\nA line of its own")
    assert sentences == ["First one here.", "Second one there.", "A line of its own"]
    chunks = group_sentences(["a" * 10, "b" * 10, "c" * 50], max_chars=25)
    assert chunks == ["a" * 10 + " " + "b" * 10, "c" * 25]


def test_page_text_tolerates_missing_fields():
    page = page_text({"page_result": "<p>Hello there.</p>", "page_name": None}, 100, 1000)
    assert page.chunks == ["Hello there."] and page.name == "" and page.snippet == ""


@pytest.mark.parametrize("text", ["I don't know", "i don\u2019t know.", "I do not know the answer", "", "  ",
                                  "I'm not sure, maybe 3"])
def test_idk_variants(text):
    assert is_idk(text) and final_answer(text) == IDK


def test_normalize_and_trim():
    assert normalize_text("  Christopher   NOLAN. ") == "christopher nolan"
    assert trim_to_tokens("a b, c d", 3) == "a b,"
    assert trim_to_tokens("short", 75) == "short"
    assert final_answer("Invalid question: he won once") == "invalid question"
    assert final_answer(" Paris\n is the capital ") == "Paris is the capital"
    assert final_answer(None) == IDK
