"""`manage.py` run as a separate process under a chosen environment: what a deployment sees when
it starts (settings are read from the environment once, at start-up).

`PRODUCTION_ENV` is the smallest set of variables the README documents for production; the
variables named in it are removed from this process's environment before `extra_env` applies,
so a test gets exactly the deployment it describes.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO_ROOT

PRODUCTION_ENV = {
    "DEBUG": "false",
    "SECRET_KEY": "k" * 20 + "Q9v!Xr2#mZ8@pL5^tN1&wB7*eF3(yH6)uJ4",
    "ALLOWED_HOSTS": "tailguard.example.com",
    "DATABASE_URL": "postgres://tailguard:secret@db.internal:5432/tailguard",
    "CELERY_BROKER_URL": "redis://redis.internal:6379/0",
    "SITE_URL": "https://tailguard.example.com",
    "EMAIL_HOST": "smtp.example.com",
}


def run_manage(args: list[str], extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in PRODUCTION_ENV and k != "DJANGO_ALLOW_ASYNC_UNSAFE"
    }
    env.update(extra_env)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
