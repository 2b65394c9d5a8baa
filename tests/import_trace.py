"""The imports grimp cannot see: which module asks `importlib.import_module` for which, while every module of the
project is imported, every config in configs/ is loaded (the loader imports stage modules by name) and every
registry entry is looked up (a lazy entry is imported on its first `get`). Prints a JSON list of [importer,
imported] pairs; `python -m tests.import_trace models evaluation ...` (tests/unit/test_import_cycles.py runs it in a
process of its own, so that nothing it imports stays in the test's)."""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def traced(packages: list[str]) -> list[tuple[str, str]]:
    edges: set[tuple[str, str]] = set()
    real = importlib.import_module

    def import_module(name: str, package: str | None = None):
        edges.add((sys._getframe(1).f_globals.get("__name__", "?"), name))
        return real(name, package)

    importlib.import_module = import_module  # type: ignore[assignment]
    try:
        for package in packages:
            root = real(package)
            for info in pkgutil.walk_packages(getattr(root, "__path__", []), f"{package}."):
                try:
                    real(info.name)
                except (ImportError, SystemExit) as err:  # an optional package (vllm, ray) not installed here
                    print(f"not traced: {info.name} ({type(err).__name__}: {err})", file=sys.stderr)
        from models.loading import load_config
        from models.registry import Registry

        for config in sorted((REPO / "configs").glob("*.yaml")):
            load_config(config)
        registries = {id(value): value for module in list(sys.modules.values()) if module is not None
                      for value in list(vars(module).values()) if isinstance(value, Registry)}
        for registry in registries.values():
            for name in list(registry):
                try:
                    registry.get(name)
                except ImportError as err:  # the edge is taken before the import fails
                    print(f"not imported: {registry.kind} {name!r} ({err})", file=sys.stderr)
    finally:
        importlib.import_module = real
    return sorted(edges)


if __name__ == "__main__":
    print(json.dumps(traced(sys.argv[1:])))
