"""No module of the project imports, through any chain, a module that imports it back.

The graph is grimp's: function-local imports and imports under `TYPE_CHECKING` count, and so does the package
`__init__` Python runs before a module it imports (`import a.b.c` runs `a` and `a.b` first), except a module's own
packages, which are already running when it is imported. To it are added the imports grimp cannot see, by name
through `importlib.import_module` (the stage modules a config loader imports, a registry's lazy entries), as
tests/import_trace.py records them."""

import json
import subprocess
import sys
import textwrap

import grimp
import networkx

PACKAGES = ("models", "evaluation", "utils", "tools", "training", "benchmarks")


def import_cycles(*packages: str, by_name: list[tuple[str, str]] = ()) -> list[list[str]]:
    """The cycles among `packages`' modules, with the imports `by_name` (importer, imported) added."""
    graph = grimp.build_graph(*packages, cache_dir=None)
    edges = networkx.DiGraph()
    edges.add_edges_from((a, b) for a, b in by_name if a in graph.modules and b in graph.modules)
    for module in graph.modules:
        edges.add_node(module)
        for imported in graph.find_modules_directly_imported_by(module):
            parts = imported.split(".")
            for end in range(1, len(parts) + 1):
                target = ".".join(parts[:end])
                if target in graph.modules and not f"{module}.".startswith(f"{target}."):
                    edges.add_edge(module, target)
    return sorted(sorted(component) for component in networkx.strongly_connected_components(edges)
                  if len(component) > 1)


def imports_by_name() -> list[tuple[str, str]]:
    traced = subprocess.run([sys.executable, "-m", "tests.import_trace", *PACKAGES], capture_output=True, text=True)
    assert traced.returncode == 0, traced.stderr[-3000:]
    return [tuple(edge) for edge in json.loads(traced.stdout)]


def test_the_project_has_no_import_cycle_even_through_imports_by_name():
    by_name = imports_by_name()
    assert ("models.loading", "models.kg.kg_stage") in by_name  # the tracer sees the loader's imports
    assert import_cycles(*PACKAGES, by_name=by_name) == []


def test_a_cycle_through_a_function_local_import_or_a_package_init_is_found(tmp_path, monkeypatch):
    package = tmp_path / "cyclic"
    (package / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "def f():\n    from cyclic import b\n",
        "b.py": "from cyclic import a\n",
        "typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cyclic.sub import leaf\n",
        "sub/__init__.py": "from cyclic.sub import leaf\n",
        "sub/leaf.py": "import cyclic.typed\n",
        "alone.py": "import cyclic.sub.leaf\n",  # through its own package, already running: no edge back
    }
    for name, text in files.items():
        (package / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert import_cycles("cyclic") == [["cyclic.a", "cyclic.b"],
                                           ["cyclic.sub", "cyclic.sub.leaf", "cyclic.typed"]]
    finally:
        sys.modules.pop("cyclic", None)
