"""Command-line tools (console scripts crag-*, see pyproject.toml); runnable as `python tools/NAME.py` too."""
