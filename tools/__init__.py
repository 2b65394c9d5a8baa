"""Command-line tools (console scripts crag-*, see pyproject.toml); runnable as `python tools/NAME.py` too. Each is a
thin command over the packages: no tool imports another (pyproject.toml's import-linter contracts)."""
