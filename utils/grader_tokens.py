"""The CRAG grader's 75-token cut: predictions are judged as the first 75 Llama-2 tokens, decoded and stripped.

The organisers' kit encodes with LlamaTokenizerFast (BOS added), keeps ids[1:76], decodes them as they are and
strips the text. The same `tokenizers` pipeline runs here on data/tokenizers/llama2/tokenizer.json (see its
PROVENANCE.md), so a cut inside a multi-byte character decodes as the kit's does (U+FFFD for an invalid byte run).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer

from utils.errors import HarnessError

TOKENIZER_PATH = Path(__file__).resolve().parent.parent / "data" / "tokenizers" / "llama2" / "tokenizer.json"
GRADER_MAX_TOKENS = 75
_VOCAB_SIZE = 32000
_BOS_ID = 1


class GraderTokenizerError(HarnessError, RuntimeError):
    """The grader's tokenizer file is missing or is not the Llama-2 tokenizer."""


@lru_cache(maxsize=4)
def grader_tokenizer(path: Path = TOKENIZER_PATH) -> Tokenizer:
    """The Llama-2 tokenizer at `path`, loaded once; a GraderTokenizerError naming the path if unusable."""
    if not path.is_file():
        raise GraderTokenizerError(f"grader tokenizer file not found: {path}")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on malformed JSON
        raise GraderTokenizerError(f"grader tokenizer file is unreadable: {path}: {exc}") from exc
    if tokenizer.get_vocab_size(with_added_tokens=True) != _VOCAB_SIZE or tokenizer.token_to_id("<s>") != _BOS_ID:
        raise GraderTokenizerError(f"grader tokenizer file is not the Llama-2 tokenizer: {path}")
    return tokenizer


def grader_ids(text: str) -> list[int]:
    """Token ids of `text` as the grader encodes it: BOS (1) first, no EOS."""
    return grader_tokenizer().encode(text, add_special_tokens=True).ids


def grader_token_count(text: str) -> int:
    """How many Llama-2 tokens the grader counts for `text` (BOS excluded)."""
    return len(grader_ids(text)) - 1


@lru_cache(maxsize=1 << 16)
def grader_cut(text: str) -> str:
    """`text` as the grader judges it: ids[1:76] decoded (special tokens kept), then stripped. Cached: judging
    reads each prediction's cut several times (both rule sets, the judge's key and prompt)."""
    kept = grader_ids(text)[1:GRADER_MAX_TOKENS + 1]
    return grader_tokenizer().decode(kept, skip_special_tokens=False).strip()


def over_grader_limit(text: str) -> bool:
    """Whether the grader's cut drops tokens of `text`."""
    return grader_token_count(text) > GRADER_MAX_TOKENS
