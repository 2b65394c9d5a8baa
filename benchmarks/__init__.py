"""The benchmarks `make bench` runs (`python -m benchmarks.NAME` from the repository root); not part of the package."""
