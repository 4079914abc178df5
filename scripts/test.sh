#!/usr/bin/env bash
# The whole suite: lint, types, the layer contract, then every test (real PostgreSQL, Redis,
# Celery worker, vLLM engine and headless Chromium). `.ci/run` calls `make test`, which runs this.
set -euo pipefail
VENV=${VENV:-.venv}
BIN="$VENV/bin"

# Headless Chromium for the browser tests comes from Debian (Playwright drives it; nothing is
# downloaded by Playwright itself).
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "test: chromium is missing; install Debian's 'chromium' package (sudo apt-get install chromium)" >&2
    exit 1
  fi
fi

# Tests use PostgreSQL when it answers (always in CI); pytest-django creates test_<name>.
if [ -z "${DATABASE_URL:-}" ]; then
  if "$BIN/python" - <<'PY'
import socket, sys
try:
    socket.create_connection(("127.0.0.1", 5432), timeout=2).close()
except OSError:
    sys.exit(1)
PY
  then
    export DATABASE_URL="postgres://postgres@127.0.0.1:5432/tailguard"
  elif [ "${CI:-}" = "true" ]; then
    echo "test: CI needs PostgreSQL on 127.0.0.1:5432" >&2
    exit 1
  fi
fi
export TAILGUARD_TEST_REDIS_URL=${TAILGUARD_TEST_REDIS_URL:-redis://127.0.0.1:6379/15}

echo "== ruff";          "$BIN/ruff" check .
echo "== ruff format";   "$BIN/ruff" format --check .
# mypy keeps its cache outside the checkout, so a fresh clone on the same machine (CI's) checks
# only what changed; mypy validates every cached module against its source's hash.
MYPY_CACHE_DIR=${MYPY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tailguard/mypy}
mkdir -p "$MYPY_CACHE_DIR" 2>/dev/null && [ -w "$MYPY_CACHE_DIR" ] || MYPY_CACHE_DIR=.mypy_cache
export MYPY_CACHE_DIR
echo "== mypy";          "$BIN/mypy"
echo "== import-linter"; "$BIN/lint-imports"
echo "== manage.py check"; "$BIN/python" manage.py check --fail-level WARNING
echo "== migrations";    "$BIN/python" manage.py makemigrations --check --dry-run
echo "== openapi";       "$BIN/python" manage.py spectacular --validate --fail-on-warn --file /dev/null
# Two passes. Tests that start engines, browsers or real workers (or measure the host) run one at
# a time: a trial measures the CPU time others use and would be marked contended beside another
# test. Every other test runs on all cores (pytest-xdist; each worker has its own test database
# and Redis database, and the tests that make database roles share one worker).
SERIAL="engine or browser or slow or celery_worker"
WORKERS=${TAILGUARD_TEST_WORKERS:-$(nproc 2>/dev/null || echo 1)}
rc=0
echo "== pytest (in parallel on $WORKERS workers: no engine, browser or worker)"
"$BIN/pytest" -n "$WORKERS" --dist loadgroup -m "not ($SERIAL)" --durations=15 "$@" || rc=$?
# 5: the pass selected no test (a narrower ARGS); not a failure.
[ "$rc" = 5 ] && rc=0
serial_rc=0
echo "== pytest (one at a time: engines, browsers, workers)"
"$BIN/pytest" -m "$SERIAL" --durations=30 "$@" || serial_rc=$?
[ "$serial_rc" = 5 ] && serial_rc=0
[ "$rc" = 0 ] && rc=$serial_rc
exit "$rc"
