"""Engine adapters, launcher, load generator, metrics and performance model. Pure Python, no Django."""
