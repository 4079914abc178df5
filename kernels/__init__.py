"""Triton kernels with plain-torch references. Standalone: imports nothing else of Tailguard."""
