"""The grader's Llama-2 tokenizer and 75-token cut, checked against published Llama-2 token ids.

Reference data (token ids are facts about Llama-2's tokenizer, kept here as data):
- REFERENCE_CASES, LLAMA_TEXT: the test cases of the npm package llama-tokenizer-js 1.2.2 (MIT, belladore.ai).
- LLAMA_CPP_CASES: llama.cpp's models/ggml-vocab-llama-spm.gguf.inp/.out (MIT, the ggml authors), ids written by
  the Hugging Face tokenizer of meta-llama/Llama-2-7b-hf with add_special_tokens=False; shipped in the PyPI sdist
  llama-cpp-python 0.3.16 under vendor/llama.cpp/models/.
Their licences are in data/tokenizers/llama2/LICENSE; how they were checked, in data/tokenizers/llama2/PROVENANCE.md.
"""

from pathlib import Path

import pytest

from utils.grader_tokens import (
    GRADER_MAX_TOKENS,
    GraderTokenizerError,
    grader_cut,
    grader_ids,
    grader_token_count,
    grader_tokenizer,
    over_grader_limit,
)

REFERENCE_CASES: list[tuple[str, list[int]]] = [
    ("grabbed", [1, 2646, 1327, 287]),
    (" grabbed", [1, 29871, 2646, 1327, 287]),
    ("           grabbed", [1, 9651, 2646, 1327, 287]),
    ("\n", [1, 29871, 13]),
    (" \n", [1, 259, 13]),
    ("\ttabs\t\t\t\tout here", [1, 29871, 12, 21175, 12, 12, 12, 12, 449, 1244]),
    ("ax\n####\nboo", [1, 4853, 13, 4136, 13, 833, 29877]),
    ("镇", [1, 29871, 30411]),
    ("🦙", [1, 29871, 243, 162, 169, 156]),
    ("🦙Ꙋ", [1, 29871, 243, 162, 169, 156, 237, 156, 141]),
    ("Ꙋ🦙", [1, 29871, 237, 156, 141, 243, 162, 169, 156]),
]

LLAMA_TEXT = ('The llama (/ˈlɑːmə/; 🦙Spanish pronunciation: [ˈʎama]) (Lama glama) is a domesticated South America'
              'n camelid, widely used as a meat and pack animal by Andean cultures since the Pre-Columbian era. L'
              'lamas are social animals and live with others as a herd. Their wool is soft and contains only a sm'
              'all amount of lanolin.[2] Llamas can learn simple tasks after a few repetitions. When using a pack'
              ', they can carry about 25 to 30% of their body weight for 8 to 13 km (5–8 miles).[3] The name llam'
              'a (in the past also spelled "lama" or "glama") was adopted by European settlers from native Peruvi'
              'ans.[4] The ancestors of llamas are thought to have originated from the Great Plains of North Amer'
              'ica about 40 million years ago, and subsequently migrated to South America about three million yea'
              'rs ago during the Great American Interchange. By the end of the last ice age (10,000–12,000 years '
              'ago), camelids were extinct in North America.[3] As of 2007, there were over seven million llamas '
              'and alpacas in South America and over 158,000 llamas and 100,000Ꙋ🦙 alpacas, descended from progeni'
              'tors imported late in the 20th century, in the United States and Canada.[5] In Aymara mythology, l'
              'lamas are important beings. The Heavenly Llama is said to drink water from the ocean and urinates '
              'as it rains.[6] According to Aymara eschatology, llamas will return to the water springs and lagoo'
              'ns where they come from at the end of time.[6]')
LLAMA_TEXT_IDS = [1, 450, 11148, 3304, 20374, 30176, 29880, 30426, 30215, 29885, 30184, 29914, 29936, 29871,
                   243, 162, 169, 156, 15495, 728, 11504, 11173, 362, 29901, 518, 30176, 31743, 3304, 2314,
                   313, 29931, 3304, 3144, 3304, 29897, 338, 263, 21849, 630, 4275, 3082, 3949, 295, 333,
                   29892, 17644, 1304, 408, 263, 27654, 322, 4870, 13019, 491, 1126, 29872, 273, 4185, 1973,
                   1951, 278, 4721, 29899, 1625, 3774, 713, 3152, 29889, 365, 5288, 294, 526, 5264, 15006, 322,
                   5735, 411, 4045, 408, 263, 902, 29881, 29889, 11275, 281, 1507, 338, 4964, 322, 3743, 871,
                   263, 2319, 5253, 310, 10906, 22878, 7226, 29906, 29962, 365, 5288, 294, 508, 5110, 2560,
                   9595, 1156, 263, 2846, 21159, 2187, 29889, 1932, 773, 263, 4870, 29892, 896, 508, 8677,
                   1048, 29871, 29906, 29945, 304, 29871, 29941, 29900, 29995, 310, 1009, 3573, 7688, 363,
                   29871, 29947, 304, 29871, 29896, 29941, 2383, 313, 29945, 29994, 29947, 7800, 467, 29961,
                   29941, 29962, 450, 1024, 11148, 3304, 313, 262, 278, 4940, 884, 805, 14356, 376, 29880,
                   3304, 29908, 470, 376, 3820, 3304, 1159, 471, 16356, 491, 7824, 3604, 9306, 515, 7531,
                   25493, 1403, 550, 7226, 29946, 29962, 450, 19525, 943, 310, 11829, 294, 526, 2714, 304, 505,
                   3978, 630, 515, 278, 7027, 13494, 1144, 310, 4644, 6813, 1048, 29871, 29946, 29900, 7284,
                   2440, 8020, 29892, 322, 17602, 9725, 630, 304, 4275, 6813, 1048, 2211, 7284, 2440, 8020,
                   2645, 278, 7027, 3082, 4124, 3167, 29889, 2648, 278, 1095, 310, 278, 1833, 14890, 5046, 313,
                   29896, 29900, 29892, 29900, 29900, 29900, 29994, 29896, 29906, 29892, 29900, 29900, 29900,
                   2440, 8020, 511, 3949, 295, 4841, 892, 1294, 5562, 297, 4644, 6813, 7226, 29941, 29962,
                   1094, 310, 29871, 29906, 29900, 29900, 29955, 29892, 727, 892, 975, 9881, 7284, 11829, 294,
                   322, 394, 29886, 562, 294, 297, 4275, 6813, 322, 975, 29871, 29896, 29945, 29947, 29892,
                   29900, 29900, 29900, 11829, 294, 322, 29871, 29896, 29900, 29900, 29892, 29900, 29900,
                   29900, 237, 156, 141, 243, 162, 169, 156, 394, 29886, 562, 294, 29892, 5153, 2760, 515, 410,
                   1885, 17259, 19673, 5683, 297, 278, 29871, 29906, 29900, 386, 6462, 29892, 297, 278, 3303,
                   3900, 322, 7400, 7226, 29945, 29962, 512, 319, 962, 2518, 22082, 3002, 29892, 11829, 294,
                   526, 4100, 367, 886, 29889, 450, 22977, 368, 365, 29880, 3304, 338, 1497, 304, 13748, 4094,
                   515, 278, 23474, 322, 5065, 262, 1078, 408, 372, 1153, 1144, 7226, 29953, 29962, 7579, 304,
                   319, 962, 2518, 831, 13496, 3002, 29892, 11829, 294, 674, 736, 304, 278, 4094, 7689, 886,
                   322, 301, 4425, 787, 988, 896, 2041, 515, 472, 278, 1095, 310, 931, 7226, 29953, 29962]

LLAMA_CPP_CASES: list[tuple[str, list[int]]] = [
    ('ied 4 ½ months', [474, 287, 29871, 29946, 29871, 30226, 7378]),
    ('Äpfel', [11585, 7810, 295]),
    ('', []),
    (' ', [259]),
    ('  ', [1678]),
    ('   ', [268]),
    ('\t', [29871, 12]),
    ('\n', [29871, 13]),
    ('\n\n', [29871, 13, 13]),
    ('\n\n\n', [29871, 13, 13, 13]),
    ('\t\n', [29871, 12, 13]),
    ('Hello world', [15043, 3186]),
    (' Hello world', [29871, 15043, 3186]),
    ('Hello World', [15043, 2787]),
    (' Hello World', [29871, 15043, 2787]),
    (' Hello World!', [29871, 15043, 2787, 29991]),
    ('Hello, world!', [15043, 29892, 3186, 29991]),
    (' Hello, world!', [29871, 15043, 29892, 3186, 29991]),
    (' this is 🦙.cpp', [29871, 445, 338, 29871, 243, 162, 169, 156, 29889, 8223]),
    ('w048 7tuijk dsdfhu', [281, 29900, 29946, 29947, 29871, 29955, 9161, 13535, 18031, 2176, 6905]),
    ('нещо на Български', [1538, 4851, 665, 1386, 29713, 1305]),
    ('កាន់តែពិសេសអាចខលចេញ',
     [29871, 31849, 31324, 31934, 228, 162, 142, 228, 161, 146, 228, 162, 133, 228, 161, 153, 228, 161, 186,
      31708, 228, 162, 132, 31708, 228, 161, 165, 31324, 228, 161, 136, 228, 161, 132, 228, 161, 158, 228, 161,
      136, 228, 162, 132, 228, 161, 140]),
    ('🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ (only emoji that has its own token)',
     [29871, 243, 162, 157, 131, 313, 8945, 29897, 29871, 243, 162, 155, 185, 30722, 243, 162, 143, 174, 30598,
      313, 20787, 953, 3848, 275, 16125, 630, 29897, 29871, 31681, 313, 6194, 953, 29877, 2397, 393, 756, 967,
      1914, 5993, 29897]),
    ('Hello', [15043]),
    (' Hello', [29871, 15043]),
    ('  Hello', [259, 15043]),
    ('   Hello', [1678, 15043]),
    ('    Hello', [268, 15043]),
    ('    Hello\n    Hello', [268, 15043, 13, 1678, 15043]),
    (' (', [29871, 313]),
    ('\n =', [29871, 13, 353]),
    ("' era", [525, 3152]),
    ("Hello, y'all! How are you 😁 ?我想在apple工作1314151天～",
     [15043, 29892, 343, 29915, 497, 29991, 1128, 526, 366, 29871, 243, 162, 155, 132, 1577, 30672, 31522,
      30505, 11548, 31041, 30732, 29896, 29941, 29896, 29946, 29896, 29945, 29896, 30408, 30739]),
    ('!!!!!!', [1738, 6824, 21004]),
    ('3', [29871, 29941]),
    ('33', [29871, 29941, 29941]),
    ('333', [29871, 29941, 29941, 29941]),
    ('3333', [29871, 29941, 29941, 29941, 29941]),
    ('33333', [29871, 29941, 29941, 29941, 29941, 29941]),
    ('333333', [29871, 29941, 29941, 29941, 29941, 29941, 29941]),
    ('3333333', [29871, 29941, 29941, 29941, 29941, 29941, 29941, 29941]),
    ('33333333', [29871, 29941, 29941, 29941, 29941, 29941, 29941, 29941, 29941]),
    ('333333333', [29871, 29941, 29941, 29941, 29941, 29941, 29941, 29941, 29941, 29941]),
    ('Cửa Việt', [315, 228, 190, 176, 29874, 10630, 30529, 29873]),
    (' discards', [29871, 2313, 3163]),
    (('\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenate'
      'd) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314'
      '151天～ ------======= нещо на Български \'\'\'\'\'\'```````""""......!!!!!!?????? I\'ve been \'told '
      "he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"),
     [29871, 13, 29871, 13, 13, 29871, 13, 13, 13, 29871, 12, 29871, 12, 12, 29871, 12, 13, 259, 13, 1678, 13,
      268, 13, 418, 13, 243, 162, 157, 131, 313, 8945, 29897, 29871, 243, 162, 155, 185, 30722, 243, 162, 143,
      174, 30598, 313, 20787, 953, 3848, 275, 16125, 630, 29897, 29871, 31681, 29871, 243, 162, 169, 156, 243,
      162, 169, 156, 29871, 29941, 29871, 29941, 29941, 29871, 29941, 29941, 29941, 29871, 29941, 29941, 29941,
      29941, 29871, 29941, 29941, 29941, 29941, 29941, 29871, 29941, 29941, 29941, 29941, 29941, 29941, 29871,
      29941, 29941, 29941, 29941, 29941, 29941, 29941, 29871, 29941, 29941, 29941, 29941, 29941, 29941, 29941,
      29941, 29871, 29941, 29889, 29941, 29871, 29941, 636, 29941, 29871, 29941, 856, 29941, 29871, 31849,
      31324, 31934, 228, 162, 142, 228, 161, 146, 228, 162, 133, 228, 161, 153, 228, 161, 186, 31708, 228, 162,
      132, 31708, 228, 161, 165, 31324, 228, 161, 136, 243, 162, 155, 132, 1577, 30672, 31522, 30505, 11548,
      31041, 30732, 29896, 29941, 29896, 29946, 29896, 29945, 29896, 30408, 30739, 448, 23648, 2751, 25512,
      1538, 4851, 665, 1386, 29713, 1305, 14550, 4907, 11120, 16159, 16159, 16159, 15945, 15945, 3045, 636,
      6824, 6824, 6824, 8773, 8773, 8773, 306, 29915, 345, 1063, 525, 29873, 1025, 540, 29915, 29879, 727,
      29892, 525, 1525, 366, 1854, 29973, 525, 29924, 451, 1854, 306, 29915, 645, 1207, 372, 29892, 525, 29928,
      366, 763, 777, 23429, 29973, 1334, 29915, 29963, 29872, 263, 29915, 29880, 29931]),
]


def _decode(ids: list[int]) -> str:
    return grader_tokenizer().decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize(("text", "ids"), REFERENCE_CASES)
def test_reference_ids_and_round_trip(text, ids):
    assert grader_ids(text) == ids
    assert grader_token_count(text) == len(ids) - 1
    assert _decode(ids[1:]) == text


def test_reference_long_text():
    assert grader_ids(LLAMA_TEXT) == LLAMA_TEXT_IDS
    assert grader_token_count(LLAMA_TEXT) == 422


@pytest.mark.parametrize(("text", "ids"), LLAMA_CPP_CASES)
def test_llama_cpp_ids(text, ids):
    assert grader_ids(text) == [1, *ids]


def test_decode_of_reference_ids():
    assert _decode([2646, 1327, 287]) == "grabbed"
    assert _decode([1, 2646, 1327, 287]) == "<s> grabbed"
    assert grader_tokenizer().decode([1, 2646, 1327, 287]) == "grabbed"


@pytest.mark.parametrize(("text", "count"), [
    ("i don't know", 5), ("I don't know", 5), ("invalid question", 2), ("Christopher Nolan", 3), ("$186.47", 7),
    ("2024-02-12", 11), ("", 0), (" ", 1)])
def test_counts(text, count):
    assert grader_token_count(text) == count


def test_cut_of_long_text_keeps_75_tokens():
    ids = grader_ids(LLAMA_TEXT)
    assert over_grader_limit(LLAMA_TEXT)
    assert grader_cut(LLAMA_TEXT) == _decode(ids[1:GRADER_MAX_TOKENS + 1]).strip()
    assert grader_cut(LLAMA_TEXT) == (
        "The llama (/ˈlɑːmə/; 🦙Spanish pronunciation: [ˈʎama]) (Lama glama) is a domesticated South American "
        "camelid, widely used as a meat and pack animal by Andean cultures since the Pre-Columbian era. Llamas are "
        "social animals and live")
    assert grader_token_count(grader_cut(LLAMA_TEXT)) == GRADER_MAX_TOKENS


def test_cut_on_a_character_boundary_keeps_whole_characters():
    text = "a b " + "🦙" * 30  # ▁a ▁b ▁ then 4 byte tokens an emoji: the 75th token ends the 18th emoji
    assert grader_cut(text) == "a b " + "🦙" * 18


@pytest.mark.parametrize(("prefix", "char"), [("", "🦙"), ("x", "Ꙋ")])
def test_cut_inside_a_character_turns_the_whole_byte_run_into_replacement_marks(prefix, char):
    # tokenizers' ByteFallback decoder, as in the kit: an invalid run of byte tokens gives one U+FFFD a byte,
    # here the 74 byte tokens after "▁" or "▁x" (18.5 four-byte emoji, 24.7 three-byte characters)
    text = prefix + char * 30
    ids = grader_ids(text)
    assert len(ids) > GRADER_MAX_TOKENS + 1
    cut = grader_cut(text)
    assert cut == _decode(ids[1:GRADER_MAX_TOKENS + 1]).strip()
    assert cut == prefix + "\ufffd" * 74


def test_cut_of_cjk_in_the_vocabulary():
    assert grader_cut("镇" * 100) == "镇" * 74  # ▁ then one token a character


@pytest.mark.parametrize("text", ["i don't know", "I don't know", "  Christopher Nolan directed Inception (2010).  ",
                                  "invalid question", "Paris\nis the capital", ""])
def test_text_under_the_limit_is_unchanged_after_strip(text):
    assert not over_grader_limit(text)
    assert grader_cut(text) == text.strip()


def test_limit_boundary():
    exactly = " ".join(["one"] * GRADER_MAX_TOKENS)
    assert grader_token_count(exactly) == GRADER_MAX_TOKENS and not over_grader_limit(exactly)
    assert grader_cut(exactly) == exactly
    longer = exactly + " one"
    assert over_grader_limit(longer) and grader_cut(longer) == exactly


def test_special_token_text_is_cut_as_the_fast_tokenizer_does():
    assert grader_ids("a<s>b") == [1, 263, 1, 289]
    assert grader_cut("a<s>b") == "a<s> b"


def test_missing_or_corrupt_file_names_the_path(tmp_path: Path):
    missing = tmp_path / "absent.json"
    with pytest.raises(GraderTokenizerError, match="absent.json"):
        grader_tokenizer(missing)
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("{not json", encoding="utf-8")
    with pytest.raises(GraderTokenizerError, match="corrupt.json"):
        grader_tokenizer(corrupt)
