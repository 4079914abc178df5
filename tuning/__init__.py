"""Workload profiling, search, gates and the continual-loop policy. Pure Python, no Django."""

__version__ = "0.1.0"
