"""The repository's shape, as docs/layout.md says it: a module name says which module it is (unique outside
tests/), and a module over 500 lines is one idea that needs the room, named here with why."""

import collections
import subprocess

from models.config import REPO_ROOT

MAX_LINES = 500
# Modules over MAX_LINES, each with the one idea it holds. A module that grows past the limit joins this list with
# its reason, or is split.
LONG_MODULES: dict[str, str] = {}


def python_modules() -> list[str]:
    found = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    return [path for path in found.stdout.split() if not path.startswith("tests/") and (REPO_ROOT / path).is_file()]


def test_module_names_are_unique_outside_tests():
    names = collections.defaultdict(list)
    for path in python_modules():
        name = path.rsplit("/", 1)[-1]
        if name not in ("__init__.py", "__main__.py"):
            names[name].append(path)
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}


def test_a_module_over_500_lines_is_on_the_list_with_its_reason():
    lengths = {path: len((REPO_ROOT / path).read_text(encoding="utf-8").splitlines()) for path in python_modules()}
    long = {path for path, lines in lengths.items() if lines > MAX_LINES}
    assert long == set(LONG_MODULES), {path: lengths.get(path) for path in long ^ set(LONG_MODULES)}
