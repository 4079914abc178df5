"""benchmarks._machine.git_state: a result names the files that ran, even from a copy of the tree
on another host whose .git is an older snapshot."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks._machine import git_state, working_tree_hash


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_tree_hash_names_the_commit_whose_files_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TAILGUARD_GIT_COMMIT", raising=False)
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / ".gitignore").write_text("scratch/\n")
    (repo / "bench.py").write_text("print(1)\n")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-qm", "one")
    committed = _git(repo, "rev-parse", "HEAD^{tree}")
    state = git_state(repo)
    assert state["tree"] == committed and state["dirty"] is False
    # Ignored files do not change it; an edit or a new file does, and the index is untouched.
    (repo / "scratch").mkdir()
    (repo / "scratch" / "out.json").write_text("{}")
    assert working_tree_hash(repo) == committed
    (repo / "bench.py").write_text("print(2)\n")
    edited = working_tree_hash(repo)
    assert edited not in (None, committed)
    (repo / "new.py").write_text("x = 1\n")
    ran = working_tree_hash(repo)
    assert ran not in (None, committed, edited)
    assert _git(repo, "diff", "--cached", "--name-only") == ""  # nothing staged by the hashing
    # Committed as it ran, the commit's tree is the hash the run recorded.
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-qm", "two")
    assert _git(repo, "rev-parse", "HEAD^{tree}") == ran


def test_no_git_gives_no_tree(tmp_path: Path) -> None:
    assert working_tree_hash(tmp_path / "nothing-here") is None
