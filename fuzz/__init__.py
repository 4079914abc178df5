"""Fuzzing of the trace parsers: targets (`targets`), the atheris harness (`fuzz_traces`), the
runner (`run`), seeds, and the crash inputs found so far (`regressions/`, replayed by pytest)."""
