"""Loading a config, and the pipeline it names: the one module that imports the stages.

A stage module imports models.config (its settings, fields and the schema) and models.stages (the machinery), so
neither of those may import a stage back; this module sits above all three. Importing it imports the built-in
stages' modules (STAGE_MODULES), each of which registers its stage and what the stage declares (settings sections,
QueryState fields, resources); `load_config` then imports a config's own `stage_modules` before it checks the
config's keys against every declared section."""

from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Sequence

from models.config import ConfigError, SystemConfig
from models.config.loader import build_config, read_config
from models.config.reference import ConfigKey, config_keys
from models.registry import RegistryError
from models.stages import STAGES, Stage, check_flow
from utils.names import did_you_mean

__all__ = ["STAGES", "STAGE_MODULES", "ConfigKey", "closing_stages", "config_from_args", "config_keys",
           "import_stage_modules", "load_config", "pipeline_stages"]

# The built-in stages' modules, in the order their stages register (a new built-in stage is a file and a line here).
STAGE_MODULES = (
    "models.stages.attributes", "models.kg.kg_stage", "models.stages.precheck", "models.stages.references",
    "models.stages.r2ag", "models.stages.evidence", "models.stages.hanrag", "models.stages.dualrag",
    "models.stages.multihop", "models.stages.knowledge", "models.stages.calculator", "models.stages.reasoning",
    "models.gate.gate_stage",
)


def import_stage_modules(modules: Sequence[str], source: str) -> None:
    """Import the config's `stage_modules`, so the stages, settings and fields they declare are registered. A module
    is imported as Python finds it: from an installed package, or from the working folder where the command runs
    (the grader's is the repository's root)."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ConfigError(f"{source}: stage_modules: cannot import {module!r}: {err}; a stage module must be "
                              "importable where the command runs: run it from the folder that holds the package, "
                              "set PYTHONPATH to that folder, or install the package") from err


import_stage_modules(STAGE_MODULES, "the built-in stages")


def load_config(path: str | os.PathLike | None = None, overlays: Sequence[str | os.PathLike] = (),
                sets: Sequence[str] = ()) -> SystemConfig:
    """Load `path` (else $CRAG_CONFIG, else configs/cpu.yaml), then each overlay file in order (a partial config
    merged key by key), then each `--set` assignment ("kg.method=functions", the value read as YAML); the config's
    `stage_modules` are imported before its keys are checked (models/config/loader.py)."""
    data, source = read_config(path, overlays, sets)
    modules = data.get("stage_modules") or []
    modules = [str(m) for m in modules] if isinstance(modules, list) else []  # anything else: refused by key
    import_stage_modules(modules, source)
    return build_config(data, source, [*STAGE_MODULES, *modules])


def config_from_args(args: argparse.Namespace) -> SystemConfig:
    """The config of a command's --config, --overlay and --set (models/config/loader.py add_config_arguments)."""
    return load_config(args.config, args.overlay, args.sets)


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
