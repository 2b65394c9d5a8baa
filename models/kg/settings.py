"""The KG stage's settings (the config section `kg`, declared by models/kg/kg_stage.py), apart from the stage so
that the client and the rules read them without importing the stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from models.config.sections import at_least


@dataclass
class KGSettings:
    """The knowledge-graph stage over the CRAG mock API, run for tasks 2 and 3."""

    method: Literal["rules", "functions"] = "rules"
    """rules: the LLM extracts the domain and entities, domain rules choose the calls; functions: the LLM lists the
    calls (at most max_calls), each checked against the endpoint table before it is made."""
    base_url: str | None = None
    """The mock API; null: $CRAG_MOCK_API_URL, else http://localhost:8000 (make eval serves data/kg)."""
    connect_timeout_s: float = field(default=1.0, metadata=at_least(0.01))
    """Seconds to connect, per attempt."""
    read_timeout_s: float = field(default=5.0, metadata=at_least(0.01))
    """Seconds an attempt waits for the reply."""
    retries: int = field(default=2, metadata=at_least(0))
    """Retries on connection errors, timeouts and HTTP 5xx, while the batch deadline affords the wait."""
    backoff_s: float = field(default=0.2, metadata=at_least(0))
    """Seconds before the first retry, doubled at each further retry."""
    down_after: int = field(default=3, metadata=at_least(1))
    """Failures in a row without an answer (no connection, a whole read timeout) that mark the server down."""
    down_s: float = field(default=30.0, metadata=at_least(0))
    """Seconds a down server's calls answer nothing at once; then calls resume only once a probe (GET /) answers."""
    max_reply_bytes: int = field(default=16_000_000, metadata=at_least(1024))
    """A longer reply is refused as it arrives (no result). The largest real replies are a few MB: 16 MB leaves a
    margin of about 3 (docs/decisions/kg-reply-cap.md)."""
    concurrency: int = field(default=8, metadata=at_least(1))
    """Calls in flight for a batch."""
    max_calls: int = field(default=6, metadata=at_least(1))
    """method functions: calls per query, at most."""
    max_chars: int = field(default=1000, metadata=at_least(0))
    """The KG text of one query is cut to this many characters (whole rows, best first)."""
    max_tokens: int = 160
    """Reply tokens of the entity extraction (rules) or of the function list (functions)."""
    price_days: int = 5
    """Daily prices kept, up to the question's date (or its current time)."""
