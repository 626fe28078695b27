"""The project's benchmarks: recovery/ is a package, run with ``python -m benchmarks.recovery``."""
