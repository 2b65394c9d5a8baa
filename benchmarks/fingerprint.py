"""What the weights fingerprint (models/llm/weights.py) reads of a 40 GB folder, and what it costs beside hashing
every byte.

1. A folder laid out as Llama-3-70B-Instruct in W4A16 (compressed-tensors pack-quantized, group 128, as
   tools/quantize.py writes it: each Linear's weight_packed, weight_scale and weight_shape; the embeddings, the head
   and the norms in bfloat16) in 9 safetensors shards with their index, a config.json and a 9 MB tokenizer.json. The
   shards are sparse files: their headers are real, their tensor bytes zeros the file system does not store, so the
   folder takes a few MB of disk while every offset the fingerprint seeks to is where a real folder has it. The
   line: the bytes the fingerprint read, as a share of the folder's size.
2. The embedded SmolLM2's converted folder, fingerprinted and hashed whole (sha256 of every weight file,
   utils/model_folders.py weights_hash): the ratio of their times, measured in the same run, each read from the page
   cache after a first pass.

    python -m benchmarks.fingerprint
"""

from __future__ import annotations

import json
import struct
import sys
import tempfile
import time
from pathlib import Path

from utils.cli import CommandParser, command

HIDDEN, INTERMEDIATE, LAYERS, VOCAB, KV = 8192, 28672, 80, 128256, 1024  # Llama-3-70B's config.json
GROUP = 128
SHARDS = 9


def llama70b_w4a16_tensors() -> list[tuple[str, str, list[int]]]:
    """(name, dtype, shape) of every tensor of the folder, in the order a shard holds them."""
    linears = {"self_attn.q_proj": (HIDDEN, HIDDEN), "self_attn.k_proj": (KV, HIDDEN),
               "self_attn.v_proj": (KV, HIDDEN), "self_attn.o_proj": (HIDDEN, HIDDEN),
               "mlp.gate_proj": (INTERMEDIATE, HIDDEN), "mlp.up_proj": (INTERMEDIATE, HIDDEN),
               "mlp.down_proj": (HIDDEN, INTERMEDIATE)}
    tensors = [("model.embed_tokens.weight", "BF16", [VOCAB, HIDDEN])]
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}"
        for name, (rows, columns) in linears.items():
            tensors += [(f"{prefix}.{name}.weight_packed", "I32", [rows, columns // 8]),
                        (f"{prefix}.{name}.weight_scale", "BF16", [rows, columns // GROUP]),
                        (f"{prefix}.{name}.weight_shape", "I64", [2])]
        tensors += [(f"{prefix}.input_layernorm.weight", "BF16", [HIDDEN]),
                    (f"{prefix}.post_attention_layernorm.weight", "BF16", [HIDDEN])]
    return tensors + [("model.norm.weight", "BF16", [HIDDEN]), ("lm_head.weight", "BF16", [VOCAB, HIDDEN])]


WIDTH = {"BF16": 2, "I32": 4, "I64": 8}


def sparse_folder(folder: Path) -> int:
    """Write the 70B folder (sparse shards); its size in bytes."""
    tensors = llama70b_w4a16_tensors()
    per_shard = -(-len(tensors) // SHARDS)
    weight_map, total = {}, 0
    for index in range(SHARDS):
        name = f"model-{index + 1:05d}-of-{SHARDS:05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for tensor, dtype, shape in tensors[index * per_shard:(index + 1) * per_shard]:
            size = WIDTH[dtype]
            for dim in shape:
                size *= dim
            header[tensor] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
            weight_map[tensor] = name
            offset += size
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with (folder / name).open("wb") as handle:
            handle.write(struct.pack("<Q", len(text)) + text)
            handle.truncate(8 + len(text) + offset)
        total += 8 + len(text) + offset
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": HIDDEN,
                                                    "num_hidden_layers": LAYERS, "vocab_size": VOCAB}))
    (folder / "tokenizer.json").write_bytes(b"{}" + b" " * (9 << 20))
    return total + sum(p.stat().st_size for p in folder.iterdir() if p.suffix == ".json")


def timed(function, *args) -> float:
    function(*args)  # into the page cache
    started = time.perf_counter()
    function(*args)
    return time.perf_counter() - started


@command
def main(argv: list[str] | None = None) -> int:
    CommandParser(description=__doc__.splitlines()[0]).parse_args(argv)
    from models.llm.hf import resolve_model_folder
    from models.llm.weights import WHOLE_BYTES, fingerprint
    from utils.model_folders import weights_hash

    with tempfile.TemporaryDirectory(prefix="fingerprint-") as scratch:
        size = sparse_folder(Path(scratch))
        _, read = fingerprint(Path(scratch))
    print(f"fingerprint: Llama-3-70B W4A16 layout, {len(llama70b_w4a16_tensors())} tensors in {SHARDS} shards, "
          f"{size / 1e9:.1f} GB: reads {read / 1e6:.1f} MB ({read / size:.3%} of the folder)")
    folder = resolve_model_folder()
    sampled, whole = timed(fingerprint, folder), timed(weights_hash, folder)
    print(f"fingerprint: {folder.name} ({sum(p.stat().st_size for p in folder.iterdir()) / 1e6:.0f} MB; files "
          f"over {WHOLE_BYTES >> 20} MiB sampled): fingerprint {sampled:.3f} s, full sha256 {whole:.3f} s "
          f"({sampled / whole:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
