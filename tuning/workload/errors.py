"""The one error type ingest raises.

A `TraceError` names the line (1-based, physical lines of the uploaded file) and the problem in
words a user can act on. It never carries text from the file: messages name fields and types,
never values that could hold prompt text, and it is raised with no chained cause or context, so
an error report that walks `__cause__`/`__context__` finds nothing either.
"""

from __future__ import annotations


class TraceError(ValueError):
    """A traffic sample that cannot be read: which line (None for the file as a whole) and why."""

    def __init__(self, line: int | None, problem: str) -> None:
        self.line = line
        self.problem = problem
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return self.problem if self.line is None else f"line {self.line}: {self.problem}"

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"TraceError(line={self.line!r}, problem={self.problem!r})"

    def __reduce__(self) -> tuple[type[TraceError], tuple[int | None, str]]:
        return (TraceError, (self.line, self.problem))
