"""Checks of a submission before it is sent (tools/check_submission.py prints them as one table): the files
(aicrowd.json, the config and its weights, requirements, the image) in `files`, the GPU plan (GPUs, quantization,
memory per T4, prompt embeddings, fine-tuned folders) in `gpu`, and what running it shows (the model's import,
batch size and sample queries, the budget plan, the rehearsal) in `run`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    warn: bool = False  # passed, with something to look at



def format_table(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    return "\n".join(f"{'FAIL' if not c.ok else 'WARN' if c.warn else 'PASS'}  {c.name:<{width}}  {c.detail}"
                     for c in checks)

