"""The stage machinery (stage.py): the registry every stage registers in by name, the base class, the context a
stage runs with and the flow check. The stages themselves are one file each (a feature's in its folder:
models/kg/kg_stage.py); models/loading.py imports the built-in ones and the config's own."""

from __future__ import annotations

from models.stages.stage import STAGES, Stage, StageContext, check_flow

__all__ = ["STAGES", "Stage", "StageContext", "check_flow"]
