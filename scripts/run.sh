#!/usr/bin/env bash
# The embedded setup: SQLite, a Celery worker with beat on a broker that needs no server, and
# the portal on http://127.0.0.1:${PORT:-8000}/. Ctrl-C stops both.
set -euo pipefail
VENV=${VENV:-.venv}
PORT=${PORT:-8000}
export DJANGO_SETTINGS_MODULE=portal.settings
# A developer's own machine, said so explicitly: debug pages, the development secret key, plain
# static files (a WSGI server defaults to DEBUG=false: portal/wsgi.py).
export DEBUG=${DEBUG:-true}
mkdir -p var

"$VENV/bin/python" manage.py migrate --noinput

"$VENV/bin/celery" -A portal worker --beat --loglevel=INFO --concurrency=2 \
  --schedule var/celerybeat-schedule >var/worker.log 2>&1 &
worker=$!
trap 'kill $worker 2>/dev/null; wait $worker 2>/dev/null' EXIT INT TERM

echo "Tailguard portal: open http://127.0.0.1:${PORT}/  (Celery worker log: var/worker.log)"
"$VENV/bin/python" manage.py runserver "127.0.0.1:${PORT}" --noreload
