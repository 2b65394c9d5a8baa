"""The KG stage's settings (the config section `kg`, declared by models/kg/kg_stage.py), apart from the stage so
that the client and the rules read them without importing the stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from annotated_types import Ge


@dataclass
class KGSettings:
    """The knowledge-graph stage over the CRAG mock API, run for tasks 2 and 3."""

    method: Literal["rules", "functions", "spans"] = "rules"
    """rules: the LLM extracts the domain and entities, domain rules choose the calls; functions: the LLM lists the
    calls (at most max_calls), each checked against the endpoint table before it is made; spans: no LLM call, the
    question's own word spans are tried as the predicted domain's names, longest first, until one names something
    the server stores (for a model too small to extract entities: docs/methods/knowledge-graph.md)."""
    base_url: str | None = None
    """The mock API; null: $CRAG_MOCK_API_URL, else http://localhost:8000 (make eval serves data/kg)."""
    connect_timeout_s: Annotated[float, Ge(0.01)] = 1.0
    """Seconds to connect, per attempt."""
    read_timeout_s: Annotated[float, Ge(0.01)] = 5.0
    """Seconds an attempt waits for the reply."""
    retries: Annotated[int, Ge(0)] = 2
    """Retries on connection errors, timeouts and HTTP 5xx, while the batch deadline affords the wait."""
    backoff_s: Annotated[float, Ge(0)] = 0.2
    """Seconds before the first retry, doubled at each further retry."""
    down_after: Annotated[int, Ge(1)] = 3
    """Failures in a row without an answer (no connection, a whole read timeout) that mark the server down."""
    down_s: Annotated[float, Ge(0)] = 30.0
    """Seconds a down server's calls answer nothing at once; then calls resume only once a probe (GET /) answers."""
    max_reply_bytes: Annotated[int, Ge(1024)] = 16_000_000
    """A longer reply is refused as it arrives (no result). The largest real replies are a few MB: 16 MB leaves a
    margin of about 3 (docs/decisions/kg-reply-cap.md)."""
    concurrency: Annotated[int, Ge(1)] = 8
    """Calls in flight for a batch."""
    max_calls: Annotated[int, Ge(1)] = 6
    """method functions: calls per query, at most."""
    max_spans: Annotated[int, Ge(1)] = 8
    """method spans: spans of the question tried per query, at most (each costs a name search or two)."""
    max_chars: Annotated[int, Ge(0)] = 1000
    """The KG text of one query is cut to this many characters (whole rows, best first)."""
    max_tokens: int = 160
    """Reply tokens of the entity extraction (rules) or of the function list (functions)."""
    price_days: int = 5
    """Daily prices kept, up to the question's date (or its current time)."""
