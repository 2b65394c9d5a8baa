"""The stages, one file each (a feature's in its folder: models/kg/kg_stage.py). Importing this package imports the
built-in stages' modules, named once in models/config/schema.py STAGE_MODULES, so that each registers its stage in
`STAGES` by name: a new built-in stage is a new file, its module in that list and its name in a strategy."""

from __future__ import annotations

from models.config import STAGE_MODULES, ConfigError, SystemConfig, import_stage_modules
from models.registry import RegistryError
from models.stages.stage import STAGES, Stage, StageContext, check_flow
from utils.names import did_you_mean

__all__ = ["STAGES", "Stage", "StageContext", "closing_stages", "pipeline_stages"]

import_stage_modules(STAGE_MODULES, "the built-in stages")


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


def closing_stages(config: SystemConfig) -> list[type[Stage]]:
    """The closing stages (`Stage.closing`: run after the answer step, listed in no strategy) of the built-in
    modules and the config's `stage_modules` that the config switches on, in registration order."""
    modules = {*STAGE_MODULES, *config.stage_modules}
    return [cls for cls in map(STAGES.get, STAGES) if cls.closing and cls.__module__ in modules and cls.active(config)]
