"""The `tailguard` command line: the one place that puts the libraries' commands together.

It sits above `tuning`, `kernels` and `serving` and below nothing: the libraries never import it,
and it never imports the Django side (the import-linter contracts in pyproject.toml).
"""
