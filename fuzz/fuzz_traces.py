"""Coverage-guided fuzzing of the trace parsers with atheris (libFuzzer for Python).

    python fuzz/fuzz_traces.py TARGET [libFuzzer options] [CORPUS_DIR ...]

TARGET is one of `fuzz.targets.TARGETS` (a parser, or "auto" for format detection). Only
`tuning` is instrumented for coverage; the fuzzer also watches string comparisons
(`startswith`/`endswith`), a dictionary (`traces.dict`) gives it the formats' key and column
names, and half of the mutations are structure-aware (`fuzz.mutator`: extreme or wrongly typed
values in the right places, which coverage alone does not steer towards). A crash is any
exception other than `TraceError` or a broken promise of `fuzz.targets.check`; libFuzzer saves
the input under `-artifact_prefix` and stops. `fuzz/run.py` drives this script for every target.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

# Run as a script, the repository root is not on the path; the fuzz package needs it.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Not the "RegEx" hook: its pattern proxy breaks `pattern.match(text, pos)`, which json uses.
atheris.enabled_hooks.add("str")
with atheris.instrument_imports(include=["tuning"]):
    from fuzz.mutator import make_mutator
    from fuzz.targets import TARGETS, Target, check


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] not in TARGETS:
        sys.exit(f"usage: {argv[0]} {{{','.join(TARGETS)}}} [libFuzzer options] [corpus dirs]")
    target: Target = argv[1]  # type: ignore[assignment]

    def test_one_input(data: bytes) -> None:
        check(target, data)

    def byte_mutate(data: bytes, max_size: int) -> bytes:
        # Looked up on each call: atheris binds `Mutate` to libFuzzer only once Fuzz() runs.
        mutated: bytes = atheris.Mutate(data, max_size)
        return mutated

    atheris.Setup([argv[0], *argv[2:]], test_one_input, custom_mutator=make_mutator(byte_mutate))
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
