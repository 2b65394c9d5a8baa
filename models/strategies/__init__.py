"""Strategies by config name."""

from __future__ import annotations

from models.strategies.hybrid import HybridStrategy

STRATEGIES = {"hybrid": HybridStrategy}
