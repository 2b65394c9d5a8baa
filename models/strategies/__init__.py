"""Strategies by config name."""

from __future__ import annotations

from models.strategies.dualrag import DualRAGStrategy
from models.strategies.hanrag import HANRAGStrategy
from models.strategies.hybrid import HybridStrategy

STRATEGIES = {"hybrid": HybridStrategy, "hanrag": HANRAGStrategy, "dualrag": DualRAGStrategy}
