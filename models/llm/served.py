"""What an OpenAI-compatible server says it serves (its GET /models), for the records of a run whose weights are on
the server's machine (models/llm/weights.py). Apart from the openai backend, so that naming weights imports no
tokenizer or model framework."""

from __future__ import annotations

import os
from typing import Any

import httpx2 as httpx  # the HTTP client of openai 3 (its fork of httpx)

from models.config import OpenAIConfig
from utils.errors import BackendUnavailable, one_line


def server_report(config: OpenAIConfig, name: str) -> dict[str, Any]:
    """What the server at llm.openai.base_url says it serves under `name`, from its GET /models (vLLM's
    show_available_models, vllm/entrypoints/openai/serving_models.py: a ModelCard's id, root and max_model_len).
    BackendUnavailable where it cannot be reached or serves no such model."""
    url = config.base_url.rstrip("/") + "/models"
    key = os.environ.get(config.api_key_env) or "EMPTY"
    try:
        reply = httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=config.request_timeout_s)
        reply.raise_for_status()
        cards = reply.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError) as err:
        raise BackendUnavailable(f"{url}: no list of served models ({one_line(err)}); start the server "
                                 "(`local_evaluation.py serve-command` prints its command) or fix "
                                 "llm.openai.base_url") from None
    card = next((c for c in cards if isinstance(c, dict) and c.get("id") == name), None)
    if card is None:
        served = ", ".join(str(c.get("id")) for c in cards if isinstance(c, dict)) or "none"
        raise BackendUnavailable(f"{url} serves no model {name!r} (it serves: {served}); serve the profile's "
                                 "model under its name, or name the served one in the profile")
    return {"id": card.get("id"), "root": card.get("root"), "max_model_len": card.get("max_model_len")}
