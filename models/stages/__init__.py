"""The stages, one file each. Importing this package imports every module in it and every `*_stage` module of a
feature folder under models/ (models/kg/, models/gate/), so that each stage registers itself in `STAGES` by name: a
new stage is a new file here and its name in a strategy."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from models.config import ConfigError, SystemConfig, import_stage_modules
from models.registry import RegistryError
from models.stages.stage import STAGES, Stage, StageContext, check_flow
from utils.names import did_you_mean

__all__ = ["STAGES", "Stage", "StageContext", "pipeline_stages"]

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")
# A feature folder's stage (models/kg/kg_stage.py, models/gate/gate_stage.py): every `*_stage` module of a package
# under models/.
_MODELS = Path(__path__[0]).parent
for _feature in sorted(m.name for m in pkgutil.iter_modules([str(_MODELS)]) if m.ispkg):
    for _module in sorted(m.name for m in pkgutil.iter_modules([str(_MODELS / _feature)]) if m.name.endswith("_stage")):
        importlib.import_module(f"models.{_feature}.{_module}")


def pipeline_stages(config: SystemConfig, missing: frozenset[str] = frozenset()) -> list[type[Stage]]:
    """The stage classes of the config's strategy, in order, less those its switches turn off and those that need
    a resource in `missing` (no KG server answered). A ConfigError names an unknown stage (with the closest
    name), a budget key that names no stage, or a stage that reads what no earlier stage writes."""
    import_stage_modules(config.stage_modules, config.source)
    classes = []
    for index, name in enumerate(config.strategy_names()):
        try:
            cls = STAGES.get(name)
        except RegistryError as err:
            raise ConfigError(f"{config.source}: strategies.{config.strategy}[{index}]: {err}") from err
        if cls.active(config) and not cls.needs & missing:
            classes.append(cls)
    for table in ("stage_min_s", "stage_share"):
        for name in getattr(config.budget, table):
            if name not in STAGES:
                raise ConfigError(f"{config.source}: budget.{table}.{name}: no such stage"
                                  f"{did_you_mean(name, STAGES)}")
    try:
        check_flow(classes)
    except RegistryError as err:
        raise ConfigError(f"{config.source}: strategy {config.strategy!r}: {err}") from err
    return classes
