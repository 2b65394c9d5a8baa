"""The stages, one file each. Importing this package imports every module in it, so that each stage registers
itself in `STAGES` by name: a new stage is a new file here and its name in a strategy."""

from __future__ import annotations

import importlib
import pkgutil

from models.config import ConfigError, SystemConfig, did_you_mean
from models.registry import RegistryError
from models.stages.base import STAGES, Stage, StageContext

__all__ = ["STAGES", "Stage", "StageContext", "pipeline_stages"]

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")


def pipeline_stages(config: SystemConfig) -> list[type[Stage]]:
    """The stage classes of the config's strategy, in order, less those its switches turn off. An unknown name
    is a ConfigError naming the list entry and the closest stage name."""
    for module in config.stage_modules:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ConfigError(f"{config.source}: stage_modules: cannot import {module!r}: {err}") from err
    classes = []
    for index, name in enumerate(config.strategy_names()):
        try:
            cls = STAGES.get(name)
        except RegistryError as err:
            raise ConfigError(f"{config.source}: strategies.{config.strategy}[{index}]: {err}") from err
        if cls.active(config):
            classes.append(cls)
    for table in ("stage_min_s", "stage_share"):
        for name in getattr(config.budget, table):
            if name not in STAGES:
                raise ConfigError(f"{config.source}: budget.{table}.{name}: no such stage"
                                  f"{did_you_mean(name, STAGES)}")
    return classes
