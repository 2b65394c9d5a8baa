"""The embedder's OpenVINO backend (`embedder.backend: openvino`).

The sentence-transformers model's transformer is converted to OpenVINO's IR from the local folder (never a hub),
once, and cached under the harness's cache (`embedder.cache_dir`); each run compiles it for the CPU at the configured
precision. The model's own modules after the transformer (pooling, normalisation) run on its token embeddings, so a
folder with another pooling gets the same vectors as under torch. Speed and agreement with torch float32:
benchmarks/pages.py's embedding line; the choice: docs/decisions/embedder-backend.md.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from loguru import logger

from models.config import ConfigError
from models.llm.backend import BackendUnavailable
from utils.cache import cache_root, content_key
from utils.model_folders import weights_hash

FORMAT = 1  # bump when the conversion below changes what the cached IR holds
MODEL_XML = "model.xml"
# OpenVINO's own name for each embedder.precision; float32 is asked for explicitly because the CPU plugin picks
# bfloat16 by itself on a CPU with AMX.
PRECISION_HINTS = {"float32": "f32", "bfloat16": "bf16"}


class _TokenEmbeddings(torch.nn.Module):
    """What sentence-transformers' Transformer module hands on as `token_embeddings`: the last hidden state."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                          return_dict=True).last_hidden_state


def token_features(model: Any, texts: list[str]) -> dict[str, torch.Tensor]:
    """The tokeniser's tensors for `texts`, cut at the model's max_seq_length (sentence-transformers 6 calls it
    `preprocess`; the submission's 3.2 `tokenize`)."""
    tokenize = getattr(model, "preprocess", None) or model.tokenize
    return {name: value for name, value in tokenize(texts).items() if isinstance(value, torch.Tensor)}


def transformer_folder(folder: Path) -> Path:
    """The folder of the model's first module (its transformer), from the model folder's modules.json."""
    modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    if not modules or not modules[0].get("type", "").endswith("Transformer"):
        raise ConfigError(f"embedder.backend openvino: {folder}'s first module is not a sentence-transformers "
                          "Transformer; set embedder.backend: torch")
    return folder / modules[0].get("path", "")


def _openvino() -> Any:
    try:
        import openvino
    except ImportError as err:
        raise BackendUnavailable("embedder.backend openvino: package openvino is missing: pip install openvino "
                                 "(the version pinned in requirements-local.txt)") from err
    return openvino


def converted_ir(model: Any, folder: Path, name: str, cache_dir: str | None) -> Path:
    """The IR (model.xml and model.bin) of `model`'s transformer, converted once and then read from the cache.

    Keyed by the transformer's weights and the versions that trace and convert it. The weights stay float32 in the
    file (OpenVINO would halve them to float16 by default); the precision is chosen when the IR is compiled.
    """
    import transformers

    openvino = _openvino()
    key = content_key(weights_hash(transformer_folder(folder)), openvino.__version__, transformers.__version__,
                      str(FORMAT))
    target = cache_root(cache_dir) / "openvino" / f"{name}-{key[:16]}"
    if (target / MODEL_XML).is_file():
        return target
    logger.info("converting {}'s transformer to OpenVINO under {} (once)", name, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    example = token_features(model, ["an example to trace", "and a longer one, padded to the same length"])
    with warnings.catch_warnings():
        # The trace warns of shape tests it fixes; for an encoder they do not vary with the input (no cache, no
        # causal mask), and the converted model's batch and sequence dimensions stay dynamic.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        ir = openvino.convert_model(_TokenEmbeddings(model[0].auto_model.eval()), example_input=example)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
    try:
        openvino.save_model(ir, staging / MODEL_XML, compress_to_fp16=False)
        os.replace(staging, target)
    except OSError:
        if not (target / MODEL_XML).is_file():
            raise
        logger.info("another process converted {} first", name)  # the rename lost a race: theirs is fine
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


class OpenVINOEncoder:
    """Unit float32 vectors from the compiled IR, batched by length (longest first) as sentence-transformers does."""

    def __init__(self, model: Any, folder: Path, name: str, precision: str, cache_dir: str | None) -> None:
        self.model = model
        core = _openvino().Core()
        ir = core.read_model(converted_ir(model, folder, name, cache_dir) / MODEL_XML)
        self.compiled = core.compile_model(ir, "CPU", {"INFERENCE_PRECISION_HINT": PRECISION_HINTS[precision]})
        self.inputs = [port.get_any_name() for port in self.compiled.inputs]

    def __call__(self, texts: list[str], batch_size: int) -> np.ndarray:
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        rows: list[np.ndarray] = [np.empty(0, dtype=np.float32)] * len(texts)
        request = self.compiled.create_infer_request()  # one per call: a request is not shared between threads
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            features: dict[str, Any] = token_features(self.model, [texts[i] for i in batch])
            request.infer({name: features[name].numpy() for name in self.inputs})
            features["token_embeddings"] = torch.from_numpy(request.get_output_tensor(0).data.copy())
            with torch.inference_mode():
                for module in list(self.model)[1:]:
                    features = module(features)
            vectors = torch.nn.functional.normalize(features["sentence_embedding"].float(), dim=-1).numpy()
            for i, vector in zip(batch, vectors):
                rows[i] = vector
        return np.vstack(rows)
