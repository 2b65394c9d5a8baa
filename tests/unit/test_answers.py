import pytest

from utils.answers import IDK, final_answer, fit_to_grader, is_idk, normalize_text
from utils.grader_tokens import grader_cut, grader_token_count

# Six prices as a model writes them: 135 Llama-2 tokens (each digit is one), though only 65 words and marks.
PRICES = ("the closing prices were $186.47 on 2024-02-12, $185.91 on 2024-02-13, $184.15 on 2024-02-14, "
          "$183.86 on 2024-02-15, $182.31 on 2024-02-16 and $181.56 on 2024-02-20, a fall of 2.6% over the week")


@pytest.mark.parametrize("text", ["I don't know", "i don\u2019t know.", "I do not know the answer", "", "  ",
                                  "I'm not sure, maybe 3"])
def test_idk_variants(text):
    assert is_idk(text) and final_answer(text) == (IDK, None)


def test_normalize_and_one_line():
    assert normalize_text("  Christopher   NOLAN. ") == "christopher nolan"
    assert final_answer("Invalid question: he won once") == ("invalid question", None)
    assert final_answer(" Paris\n is the capital ") == ("Paris is the capital", None)
    assert final_answer(None) == (IDK, None)


def test_an_answer_within_the_limit_is_kept_whole():
    text = "christopher nolan directed inception (2010), and emma thomas produced it"
    assert grader_token_count(text) < 75 and final_answer(text) == (text, None)


def test_a_long_list_is_cut_at_an_item_boundary_the_grader_keeps_whole():
    assert grader_token_count(PRICES) > 75
    answer, change = final_answer(PRICES)
    assert grader_token_count(answer) <= 75 and grader_cut(answer) == answer
    assert answer == PRICES[:PRICES.index(", $183.86")]  # the last whole item that fits, without its comma
    assert "from 135 grader tokens" in change
    assert grader_cut(PRICES).endswith("$183.86 on 20")  # where the grader would have cut it: inside a date


def test_never_cut_inside_a_number_or_a_name():
    numbers = "the populations are " + ", ".join(f"{n:,}" for n in range(1_000_001, 1_000_031))
    answer = fit_to_grader(numbers)
    assert answer is not None and grader_token_count(answer) <= 75
    assert answer.split()[-1].replace(",", "").isdigit() and len(answer.split()[-1]) == 9  # 1,000,0xx whole
    names = "the members were " + " and ".join(["Sir Paul McCartney of Liverpool"] * 12)
    cut = fit_to_grader(names)
    assert cut is not None and cut.endswith("Sir Paul McCartney of Liverpool")


def test_no_boundary_within_the_limit_is_idk():
    answer, change = final_answer("x" * 400)
    assert answer == IDK and "no clause boundary" in change
