import pytest

from utils.answers import IDK, final_answer, is_idk, normalize_text, trim_to_tokens


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
