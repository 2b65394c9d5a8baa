"""Holding the served engine to the stack that trains and converts the model, by log-probabilities.

transformers in .venv (the stack that writes the folders) scores token sequences by teacher forcing; vLLM scores
the same sequences with `prompt_logprobs`, in the submission's venv. `logprob_mismatches` is vLLM's own rule for
its model tests (tests/models/utils.py `check_logprobs_close`): where the two sides' most likely tokens differ,
each must be among the other's top k; and, since both sides read the same tokens here, each token's
log-probability must agree within a tolerance. `perplexity` of the same scores is make bench's engine line.

A scored position is {"token": id, "logprob": float, "top": [[id, logprob], ...]} (most likely first); torch,
transformers and vLLM are imported by the function that needs them, so either venv imports this module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

Position = dict[str, Any]


def hf_scores(model: Any, sequences: Sequence[Sequence[int]], starts: Sequence[int], top_k: int
              ) -> list[list[Position]]:
    """Teacher forcing in transformers: each sequence's tokens from `starts[i]` on, scored given all before them."""
    import torch

    scored = []
    for ids, start in zip(sequences, starts):
        with torch.no_grad():
            logits = model(torch.tensor([list(ids)], device=model.device)).logits[0].float()
        logprobs = torch.log_softmax(logits[start - 1:len(ids) - 1], dim=-1)
        top = torch.topk(logprobs, top_k, dim=-1)
        scored.append([{"token": int(token), "logprob": float(row[token]),
                        "top": [[int(i), float(v)] for i, v in zip(top.indices[n], top.values[n])]}
                       for n, (token, row) in enumerate(zip(ids[start:], logprobs))])
    return scored


def vllm_scores(llm: Any, sequences: Sequence[Sequence[int]], starts: Sequence[int], top_k: int
                ) -> list[list[Position]]:
    """The same scores from a `vllm.LLM`: each sequence as a prompt of token ids, with `prompt_logprobs=top_k`
    (vLLM returns, for each prompt token after the first, the top k and the token itself)."""
    from vllm import SamplingParams

    outputs = llm.generate([{"prompt_token_ids": list(ids)} for ids in sequences],
                           SamplingParams(max_tokens=1, prompt_logprobs=top_k, temperature=0.0), use_tqdm=False)
    scored = []
    for ids, start, output in zip(sequences, starts, outputs):
        positions = []
        for token, entry in zip(ids[start:], output.prompt_logprobs[start:]):
            ranked = sorted(entry.items(), key=lambda item: -item[1].logprob)
            positions.append({"token": int(token), "logprob": float(entry[token].logprob),
                              "top": [[int(i), float(lp.logprob)] for i, lp in ranked[:top_k]]})
        scored.append(positions)
    return scored


def logprob_mismatches(reference: list[list[Position]], test: list[list[Position]], tolerance: float) -> list[str]:
    """Where `test` departs from `reference`, one line each: a token whose log-probabilities differ by more than
    `tolerance`, or two different most likely tokens of which one is not in the other side's top k."""
    found = []
    for n, (ours, theirs) in enumerate(zip(reference, test, strict=True)):
        for m, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            if a["token"] != b["token"]:
                raise ValueError(f"sequence {n}, position {m}: the two sides scored different tokens")
            if abs(a["logprob"] - b["logprob"]) > tolerance:
                found.append(f"sequence {n}, position {m}, token {a['token']}: log-probability "
                             f"{a['logprob']:.4f} against {b['logprob']:.4f}")
            best_a, best_b = a["top"][0][0], b["top"][0][0]
            if best_a != best_b and (best_a not in {i for i, _ in b["top"]} or best_b not in {i for i, _ in a["top"]}):
                found.append(f"sequence {n}, position {m}: most likely {best_a} against {best_b}, one not in the "
                             "other's top k")
    return found


def largest_gap(reference: list[list[Position]], test: list[list[Position]]) -> float:
    """The largest difference of one token's log-probability between the two sides."""
    return max((abs(a["logprob"] - b["logprob"]) for ours, theirs in zip(reference, test)
                for a, b in zip(ours, theirs)), default=0.0)


def perplexity(scores: list[list[Position]]) -> float:
    """exp of the mean negative log-probability over every scored token."""
    logprobs = [p["logprob"] for positions in scores for p in positions]
    return math.exp(-sum(logprobs) / len(logprobs))
