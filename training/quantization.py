"""The quantizer's texts and scores (tools/quantize.py, benchmarks/gptq_vs_rtn.py): calibration and held-out texts
read from JSONL, tokenized and cut as the hf backend cuts a prompt, and the perplexity and KL divergence of
quantized models against their reference.

Standard library only at the top: .venv-quantize, which does not install the project, imports it too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from utils.errors import HarnessError
from utils.token_cut import kept_spans

CALIBRATION, HELD_OUT = "calibration", "held_out"


class QuantizeError(HarnessError, ValueError):
    """A bad input: the message is one line naming it and the fix."""


def read_texts(path: Path, split: str | None) -> list[str]:
    """The texts of a JSONL of {"text", "split"?} rows in `split` (a row without "split" is calibration; None:
    every row); a QuantizeError for a missing or bad file or no such rows."""
    if not path.is_file():
        raise QuantizeError(f"--texts {path}: no such file; make one with `.venv/bin/python tools/quantize.py "
                            "texts --model FOLDER --out FILE` (or give a JSONL of {\"text\": ...} rows)")
    texts, splits = [], set()
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise QuantizeError(f"--texts {path}:{number}: not JSON ({err.msg}); give one JSON object per "
                                    "line") from err
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise QuantizeError(f"--texts {path}:{number}: needs a \"text\" string; give {{\"text\": ...}} rows")
            row_split = row.get("split", CALIBRATION)
            splits.add(row_split)
            if (split is None or row_split == split) and row["text"].strip():
                texts.append(row["text"])
    if not texts:
        found = f"its splits are {sorted(map(str, splits))}" if splits else "it has no rows"
        raise QuantizeError(f"--texts {path}: no non-empty {split or ''} texts ({found}); give a file with some, "
                            f"e.g. from `tools/quantize.py texts` (fewer --held-out)")
    return texts


def cut(ids: list[int], limit: int) -> list[int]:
    """An over-long token list's head quarter and tail, as the hf backend cuts an over-long prompt."""
    return [token for span in kept_spans(len(ids), limit) for token in ids[span]]


def tokenize(tokenizer: Any, texts: list[str], max_seq_length: int) -> list[list[int]]:
    return [cut(tokenizer(text, add_special_tokens=False)["input_ids"], max_seq_length) for text in texts]


def load_for_eval(folder: Path, device: str) -> Any:
    """A model folder (dense or compressed-tensors) ready to score, in float32 on a CPU: a W4A16 folder is
    decompressed to its int4 x scale weights, so the scores are those of the quantized weights."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if device == "cpu" else "auto"
    model: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)  # transformers types .to() for a model
    return model.to(device).eval()


def score(reference: Any, models: dict[str, Any], token_lists: list[list[int]], device: str
          ) -> dict[str, dict[str, float]]:
    """Per model (the reference under "reference"): perplexity over every next-token prediction of the texts, and
    the mean KL divergence KL(reference || model) of the next-token distributions."""
    import torch
    from tqdm import tqdm

    nll = {name: 0.0 for name in ("reference", *models)}
    kl = {name: 0.0 for name in models}
    count = 0
    with torch.inference_mode():
        for ids in tqdm(token_lists, desc="scoring", unit="text"):
            inputs = torch.tensor([ids], device=device)
            targets = inputs[0, 1:]
            ref = torch.log_softmax(reference(inputs).logits[0, :-1].float(), dim=-1)
            nll["reference"] += -ref.gather(1, targets[:, None]).sum().item()
            for name, model in models.items():
                logp = torch.log_softmax(model(inputs).logits[0, :-1].float(), dim=-1)
                nll[name] += -logp.gather(1, targets[:, None]).sum().item()
                kl[name] += (ref.exp() * (ref - logp)).sum().item()
            count += len(ids) - 1
    result = {name: {"ppl": float(torch.tensor(total / count).exp()), "tokens": count} for name, total in nll.items()}
    for name in models:
        result[name]["kl"] = kl[name] / count
    return result
