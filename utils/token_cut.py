"""How an over-long token sequence is cut, the same wherever the project cuts one (the hf and openai backends'
prompts, the quantizer's calibration texts): the head quarter (a prompt's instructions) and the tail (its question)
stay, the middle (the references) goes. Standard library only: the quantizer's venv imports it."""

from __future__ import annotations


def kept_spans(length: int, limit: int) -> list[slice]:
    """The slices of a sequence of `length` tokens that stay under `limit`."""
    if length <= limit:
        return [slice(0, length)]
    head = limit // 4
    return [slice(0, head), slice(length - (limit - head), length)]
