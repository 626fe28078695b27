"""Carries the patch series in patches/ onto the released torch 2.1.2 wheel.

See install.py for what gets installed, and series.py for how the series is read.
"""
