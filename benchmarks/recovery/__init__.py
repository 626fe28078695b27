"""Recovery after a lost rank: DDP following its group, against torchft and a restart.

``python -m benchmarks.recovery --help`` says what it measures. The driver (``__main__``,
:mod:`.measure`, :mod:`.driver`) starts the worker processes as ``python -m
benchmarks.recovery.worker_<kind>``; nothing here imports torch, so that a stock process
(:mod:`.stock_torch`) can choose the wheel's own files before torch is imported.
"""
