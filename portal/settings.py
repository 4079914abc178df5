"""Tailguard portal settings: one module, configured from the environment.

Unset variables give the embedded setup (`make run` on a laptop): SQLite, a Celery broker that
needs no server, console email, local storage. Production sets the variables documented in the
README ("Production settings"); with them `manage.py check --deploy` is clean (a test proves it).
"""

from __future__ import annotations

import re
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from portal.env import Env

env = Env()

BASE_DIR = Path(__file__).resolve().parent.parent
# Runtime state of the embedded setup (SQLite files, broker, uploads); ignored by git.
VAR_DIR = Path(env.str("TAILGUARD_VAR_DIR", str(BASE_DIR / "var")) or "")
VAR_DIR.mkdir(parents=True, exist_ok=True)

# On for the embedded setup's commands (manage.py, tests, `make run`, which also sets it); the
# WSGI entry point that production servers load defaults it off (portal/wsgi.py).
DEBUG = env.bool("DEBUG", default=True)

_secret = env.str("SECRET_KEY")
if _secret is None:
    if not DEBUG:
        raise ImproperlyConfigured("environment variable SECRET_KEY is required when DEBUG=false")
    # Development only: a fixed key is fine where nothing is exposed.
    _secret = "django-insecure-tailguard-development-key-do-not-use-in-production"
SECRET_KEY = _secret

ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", [])
# Absolute base of links sent by email (invitations); the request's host is not trusted for it.
SITE_URL = (env.str("SITE_URL", "http://127.0.0.1:8000") or "").rstrip("/")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "portal.accounts",
    "portal.traffic",
    "portal.jobs",
    "portal.endpoints",
    "portal.billing",
    "portal.benchmarks",
    "portal.catalog",
    "portal.onboarding",
    "portal.pools",
    "portal.sla",
    "portal.alerts",
    "portal.ops",
    "portal.outbox",
    "compliance",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Counts and times every request for the operator's /metrics (portal/ops).
    "portal.ops.middleware.RequestMetricsMiddleware",
    # Content-Security-Policy and its companions (portal/headers.py).
    "portal.headers.SecurityHeadersMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # One transaction per request, its row-level security scope set before the view.
    "portal.accounts.middleware.RequestScopeMiddleware",
    # Inside the request's scope: the 404 page it draws reads the signed-in user's organizations.
    "portal.errors.FriendlyNotFoundMiddleware",
]

ROOT_URLCONF = "portal.urls"
CSRF_FAILURE_VIEW = "portal.errors.csrf_failure"
WSGI_APPLICATION = "portal.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "portal.accounts.context_processors.current_organization",
            ],
        },
    },
]

# Database: DATABASE_URL selects the server (PostgreSQL in production and tests); unset means an
# embedded SQLite file.
_database_url = env.str("DATABASE_URL")
if _database_url is None:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "tailguard.sqlite3",
        }
    }
else:
    try:
        # Persistent connections are checked before reuse: a database restart (or a session
        # ended by the server) costs one reconnect, not an error on the next request.
        DATABASES = {
            "default": dict(dj_database_url.parse(_database_url, conn_max_age=60, conn_health_checks=True))
        }
    except ValueError as exc:
        raise ImproperlyConfigured(
            f"environment variable DATABASE_URL is not a database URL: {exc}"
        ) from None

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_USER_MODEL = "accounts.User"
LOGIN_URL = "accounts:login"
LOGIN_REDIRECT_URL = "accounts:dashboard"
LOGOUT_REDIRECT_URL = "accounts:login"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "django.contrib.staticfiles.storage.StaticFilesStorage"
            if DEBUG
            else "whitenoise.storage.CompressedManifestStaticFilesStorage"
        )
    },
}

# Email: console in the embedded setup; SMTP when EMAIL_HOST is set.
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", "Tailguard <noreply@tailguard.local>")
if env.is_set("EMAIL_BACKEND"):
    EMAIL_BACKEND = env.required_str("EMAIL_BACKEND")
elif env.is_set("EMAIL_HOST"):
    EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
else:
    EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
EMAIL_HOST = env.str("EMAIL_HOST", "localhost")
EMAIL_PORT = env.int("EMAIL_PORT", 587, minimum=1)
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=True)
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT_S", 10, minimum=1)
if env.is_set("EMAIL_FILE_PATH"):
    EMAIL_FILE_PATH = env.required_str("EMAIL_FILE_PATH")

INVITATION_TTL_HOURS = env.int("INVITATION_TTL_HOURS", 24 * 7, minimum=1)

# Celery: CELERY_BROKER_URL selects Redis or RabbitMQ; unset means an embedded SQLite broker
# (kombu's SQLAlchemy transport), which needs no server.
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", f"sqla+sqlite:///{VAR_DIR / 'celery-broker.sqlite3'}")
# Tasks record their outcome in the database rows they work on, not in a result backend.
CELERY_RESULT_BACKEND = env.str("CELERY_RESULT_BACKEND")
CELERY_TASK_IGNORE_RESULT = CELERY_RESULT_BACKEND is None
CELERY_TASK_DEFAULT_QUEUE = env.str("CELERY_TASK_DEFAULT_QUEUE", "tailguard")
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE = {
    "endpoints-watch": {"task": "portal.endpoints.tasks.endpoints_watch", "schedule": 15.0},
    "invitations-expire": {
        "task": "portal.accounts.tasks.invitations_expire",
        "schedule": 3600.0,
    },
    # Workload files a killed worker wrote for a sample whose row never committed.
    "workloads-sweep": {"task": "portal.traffic.tasks.workloads_sweep", "schedule": 3600.0},
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "portal.api.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # Deeply nested JSON is a 400 (DRF's parser let a RecursionError through: a 500); a file
    # over TRAFFIC_UPLOAD_MAX_BYTES is a 400 naming its field, never silently dropped.
    "DEFAULT_PARSER_CLASSES": [
        "portal.restkit.parsers.StrictJSONParser",
        "rest_framework.parsers.FormParser",
        "portal.restkit.parsers.LimitedMultiPartParser",
    ],
    "DEFAULT_SCHEMA_CLASS": "portal.api.schema.PortalAutoSchema",
    "DEFAULT_PAGINATION_CLASS": "portal.api.pagination.StrictLimitOffsetPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "portal.api.errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Tailguard API",
    "DESCRIPTION": "Continual inference: tenants, traffic samples, tuning jobs and endpoints.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # The upload's `trace_format` and the sample's `requested_format` share one set of choices:
    # one schema component, one name.
    "ENUM_NAME_OVERRIDES": {
        "TraceFormatEnum": "portal.traffic.models.TrafficSample.Format",
        # Alerts: what happened (an alert's kind, a channel's subscriptions) and how it is sent.
        "AlertKindEnum": "portal.alerts.models.AlertKind",
        "AlertChannelKindEnum": "portal.alerts.models.AlertChannel.Kind",
        # Endpoints and benchmark reports (issue 22): each its own `status` vocabulary.
        "EndpointStatusEnum": "portal.endpoints.models.Endpoint.Status",
        "BenchmarkReportStatusEnum": "portal.benchmarks.models.BenchmarkReport.Status",
    },
}

# Security: on by default whenever DEBUG is off; each can be relaxed explicitly (for example
# behind a TLS-terminating proxy that already redirects).
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env.bool("BEHIND_TLS_PROXY", False) else None
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=not DEBUG)
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=not DEBUG)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=not DEBUG)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31_536_000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=not DEBUG)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=not DEBUG)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
# Origins a form's redirect may lead to besides the portal (CSP form-action): Stripe's hosted
# Checkout and customer portal, where the billing pages send an admin.
CSP_FORM_ACTION_EXTRA = env.list(
    "CSP_FORM_ACTION_EXTRA", ["https://checkout.stripe.com", "https://billing.stripe.com"]
)
for _origin in CSP_FORM_ACTION_EXTRA:
    if not re.fullmatch(r"https://[A-Za-z0-9.-]+(:[0-9]{1,5})?", _origin):
        raise ImproperlyConfigured(
            f"CSP_FORM_ACTION_EXTRA: {_origin!r} is not an https origin (https://host or https://host:port)"
        )

# Upload limits (bytes). Non-file form bodies above DATA_UPLOAD_MAX_MEMORY_SIZE are refused;
# files stream to disk and stop at TRAFFIC_UPLOAD_MAX_BYTES while they arrive.
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("DATA_UPLOAD_MAX_MEMORY_SIZE", 5 * 1024 * 1024, minimum=1024)
FILE_UPLOAD_HANDLERS = ["portal.traffic.uploads.LimitedTemporaryFileUploadHandler"]
TRAFFIC_UPLOAD_MAX_BYTES = env.int("TRAFFIC_UPLOAD_MAX_BYTES", 1 << 30, minimum=1)
# Limits applied while reading (after gzip decompression: a zip bomb stops here).
TRAFFIC_MAX_DECOMPRESSED_BYTES = env.int("TRAFFIC_MAX_DECOMPRESSED_BYTES", 4 << 30, minimum=1)
TRAFFIC_MAX_LINE_BYTES = env.int("TRAFFIC_MAX_LINE_BYTES", 16 << 20, minimum=1024)
# Lines (and blank lines) one upload may have, and the wall-clock time reading it may take: a
# gzip "newline bomb" stops at these with a clear error instead of holding a worker for hours.
TRAFFIC_MAX_LINES = env.int("TRAFFIC_MAX_LINES", 50_000_000, minimum=1000)
TRAFFIC_MAX_BLANK_LINES = env.int("TRAFFIC_MAX_BLANK_LINES", 100_000, minimum=0)
TRAFFIC_INGEST_MAX_S = env.int("TRAFFIC_INGEST_MAX_S", 900, minimum=10)
# The ingest task's hard time limit is TRAFFIC_INGEST_MAX_S + this (the backstop for a read stuck
# outside its own checks).
TRAFFIC_INGEST_GRACE_S = env.int("TRAFFIC_INGEST_GRACE_S", 300, minimum=10)
# An ingest holds its sample under a lease (portal/leases.py) kept fresh while it reads: a sample
# still validating with a lease this old lost its worker, and the redispatch queues it again
# (removing its decrypted copy), or fails it after TRAFFIC_INGEST_MAX_ATTEMPTS.
TRAFFIC_INGEST_LEASE_S = env.int("TRAFFIC_INGEST_LEASE_S", 60, minimum=10)
TRAFFIC_INGEST_MAX_ATTEMPTS = env.int("TRAFFIC_INGEST_MAX_ATTEMPTS", 3, minimum=1)
# Private folder where an upload waits for the ingest task (deleted once read).
TRAFFIC_STAGING_DIR = Path(env.str("TRAFFIC_STAGING_DIR", str(VAR_DIR / "staging")) or "")
# Numbers-only replayable copies of ingested samples (what tuning jobs replay).
TRAFFIC_WORKLOAD_DIR = Path(env.str("TRAFFIC_WORKLOAD_DIR", str(VAR_DIR / "workloads")) or "")

# Tuning jobs: where their state and engine logs live, which server folders models may be
# registered from, and how long a trial step may hold a job before another worker takes over.
TUNING_WORK_DIR = Path(env.str("TUNING_WORK_DIR", str(VAR_DIR / "jobs")) or "")
TUNING_MODEL_ROOTS = [Path(p) for p in env.list("TUNING_MODEL_ROOTS", [str(VAR_DIR / "models")])]
TUNING_LEASE_S = env.int("TUNING_LEASE_S", 120, minimum=10)
# The continual loop judges drift only on evidence: at least this many finished requests over at
# least this many seconds of observed traffic (a few dozen test calls to a fresh endpoint are not
# a workload). benchmarks/drift_false_alarm.py measures the false-alarm rate these give.
LOOP_MIN_LIVE_REQUESTS = env.int("LOOP_MIN_LIVE_REQUESTS", 200, minimum=20)
LOOP_MIN_LIVE_SPAN_S = env.int("LOOP_MIN_LIVE_SPAN_S", 600, minimum=30)
# A re-tuning job measures engines; on the host serving the live endpoint those measurements and
# the live traffic disturb each other. Off unless the operator allows it (its trials then record
# the live traffic as foreign load and are excluded when contended).
LOOP_RETUNE_ON_SERVING_HOST = env.bool("LOOP_RETUNE_ON_SERVING_HOST", default=False)
# The one beat of background work, `redispatch` (portal/outbox), every REDISPATCH_INTERVAL_S:
# - recovers what a dead worker or a lost message left, as each app registers it
#   (portal.outbox.recovery): job steps and batch trials the broker lost, owed again (a message
#   the broker took but nobody claimed after TUNING_REDISPATCH_AFTER_S), steps and trials whose
#   worker died replaced (a job whose step dies TUNING_MAX_INTERRUPTIONS times in a row fails);
#   sample ingests and benchmark runs whose worker died, queued again;
# - sends what the task outbox holds and the broker did not take (it was down): job steps and
#   batch trials, sample ingests, endpoint operations, benchmark runs, invitations and billing
#   notices are recorded there with the change that makes them due, at most OUTBOX_BATCH a run;
#   messages sent more than OUTBOX_KEEP_SENT_DAYS ago are deleted;
# - then delivers the alerts that are due (webhooks and e-mail, which may be slow).
REDISPATCH_INTERVAL_S = env.int("REDISPATCH_INTERVAL_S", 15, minimum=1)
for _old in ("TUNING_REDISPATCH_INTERVAL_S", "OUTBOX_REDISPATCH_INTERVAL_S", "ALERT_REDISPATCH_INTERVAL_S"):
    if env.is_set(_old):  # the three beats became one: a setting that would do nothing says so
        raise ImproperlyConfigured(f"environment variable {_old} is gone: set REDISPATCH_INTERVAL_S")
TUNING_REDISPATCH_AFTER_S = env.int("TUNING_REDISPATCH_AFTER_S", 900, minimum=1)
TUNING_MAX_INTERRUPTIONS = env.int("TUNING_MAX_INTERRUPTIONS", 3, minimum=1)
# A benchmark run whose worker died this many times in a row fails instead of being queued again.
BENCHMARK_MAX_ATTEMPTS = env.int("BENCHMARK_MAX_ATTEMPTS", 3, minimum=1)
# A job on a pool measures up to this many search trials at once, one per idle host.
TUNING_MAX_PARALLEL_TRIALS = min(env.int("TUNING_MAX_PARALLEL_TRIALS", 8, minimum=1), 64)
OUTBOX_BATCH = env.int("OUTBOX_BATCH", 100, minimum=1)
OUTBOX_KEEP_SENT_DAYS = env.int("OUTBOX_KEEP_SENT_DAYS", 7, minimum=1)
CELERY_BEAT_SCHEDULE["redispatch"] = {
    "task": "portal.outbox.tasks.redispatch",
    "schedule": float(REDISPATCH_INTERVAL_S),
}
# Job report PDFs: the headless Chromium that prints them (a name on PATH or a path), and how
# long one print may take before the request gives up with an error.
REPORT_CHROMIUM = env.str("REPORT_CHROMIUM", "chromium")
REPORT_PDF_TIMEOUT_S = env.int("REPORT_PDF_TIMEOUT_S", 60, minimum=5)
# Dedicated endpoints: their config, key and logs on the serving host. (How long their metric
# snapshots are kept is each organization's retention policy, in the compliance app.)
ENDPOINTS_DIR = Path(env.str("ENDPOINTS_DIR", str(VAR_DIR / "endpoints")) or "")
# Engine-host agents (`tailguard agent --pool NAME`, portal/pools): how often each reports its
# host, and how long a silent host still counts as live (work for its pool otherwise shows
# "waiting for a host of pool X"). Work for a pool goes to its queue through Celery routing.
AGENT_HEARTBEAT_S = env.int("AGENT_HEARTBEAT_S", 15, minimum=1)
POOL_HOST_LIVE_S = env.int("POOL_HOST_LIVE_S", 60, minimum=2)
CELERY_TASK_ROUTES = ("portal.pools.routing.route_task",)
# Where clients reach an endpoint that has no pool (this deployment's own machine): {port} is the
# endpoint's port, {endpoint} its short name. Pools carry their own.
ENDPOINT_URL_TEMPLATE = env.str("ENDPOINT_URL_TEMPLATE", "http://127.0.0.1:{port}") or ""
# Bounded broker calls: a request that enqueues work must not hang on a broker that is down or
# stuck (connecting, then each command); work it could not enqueue stays queued in the database.
CELERY_BROKER_CONNECTION_TIMEOUT = env.int("CELERY_BROKER_CONNECT_TIMEOUT_S", 3, minimum=1)
REDIS_BROKER_TIMEOUTS = {
    "socket_connect_timeout": CELERY_BROKER_CONNECTION_TIMEOUT,
    "socket_timeout": env.int("CELERY_BROKER_SOCKET_TIMEOUT_S", 5, minimum=2),
}
# The broker re-delivers a task whose worker died after this long; longer than one trial.
# Only Redis takes these: the embedded SQLAlchemy transport hands unknown options to
# create_engine(), which refuses them and stops the worker.
CELERY_BROKER_TRANSPORT_OPTIONS = (
    {
        **REDIS_BROKER_TIMEOUTS,
        "visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT_S", 3600, minimum=10),
        # How often a worker looks for messages whose worker died (kombu's sweep).
        "unacked_restore_interval": env.int("CELERY_UNACKED_RESTORE_INTERVAL_S", 10, minimum=1),
        "unacked_restore_throttle": 1,
    }
    if (CELERY_BROKER_URL or "").startswith(("redis://", "rediss://", "sentinel://"))
    else {}
)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {
        "handlers": ["console"],
        "level": env.choice("LOG_LEVEL", "INFO", ["DEBUG", "INFO", "WARNING", "ERROR"]),
    },
}


# --- Compliance (issue 8): residency, sensitive-object storage, retention, access ---------------
def _region_mapping(name: str) -> dict[str, str]:
    """`us=value,eu=value` into a dict; fails loudly on a malformed item."""
    mapping: dict[str, str] = {}
    for item in env.list(name, []):
        region, sep, value = item.partition("=")
        if not sep or not region.strip() or not value.strip():
            raise ImproperlyConfigured(f"environment variable {name}: {item!r} is not region=value")
        mapping[region.strip()] = value.strip()
    return mapping


# The regions this deployment stores data and runs compute in. The embedded setup has one,
# "local" (this machine). An organization without a residency policy is limited to
# COMPLIANCE_DEFAULT_REGIONS: the home region only, never "anywhere".
COMPLIANCE_REGIONS = env.list("COMPLIANCE_REGIONS", ["local"])
COMPLIANCE_DEFAULT_REGIONS = env.list("COMPLIANCE_DEFAULT_REGIONS", COMPLIANCE_REGIONS[:1])
if not set(COMPLIANCE_DEFAULT_REGIONS) <= set(COMPLIANCE_REGIONS):
    raise ImproperlyConfigured("COMPLIANCE_DEFAULT_REGIONS must be a subset of COMPLIANCE_REGIONS")
# The residency code of the machine the portal and its local engine run on ("us" for a US data
# centre): the local CPU hardware's region in the catalog, which reads the same variable.
LOCAL_HARDWARE_REGION = env.str("LOCAL_HARDWARE_REGION", "local").strip().lower() or "local"
if not re.fullmatch(r"[a-z][a-z0-9-]{0,31}", LOCAL_HARDWARE_REGION):
    raise ImproperlyConfigured(
        f"environment variable LOCAL_HARDWARE_REGION must be a residency code such as 'us' or 'local', "
        f"not {LOCAL_HARDWARE_REGION!r}"
    )
# Sensitive objects (raw uploads, signed BAAs, exports): "local" keeps one encrypted folder per
# region; "s3" keeps one bucket per region (COMPLIANCE_S3_BUCKETS=us=bucket-a,eu=bucket-b).
COMPLIANCE_STORAGE_BACKEND = env.choice("COMPLIANCE_STORAGE_BACKEND", "local", ["local", "s3"])
COMPLIANCE_STORAGE_DIR = Path(env.str("COMPLIANCE_STORAGE_DIR", str(VAR_DIR / "objects")) or "")
# 32 url-safe base64 bytes (AES-256-GCM) encrypting the local folders. Unset, a key is derived
# from SECRET_KEY; set it in production so that rotating SECRET_KEY keeps old objects readable.
COMPLIANCE_STORAGE_KEY = env.str("COMPLIANCE_STORAGE_KEY")
COMPLIANCE_S3_BUCKETS = _region_mapping("COMPLIANCE_S3_BUCKETS")
COMPLIANCE_S3_KMS_KEYS = _region_mapping("COMPLIANCE_S3_KMS_KEYS")
COMPLIANCE_S3_REGION_NAMES = _region_mapping("COMPLIANCE_S3_REGION_NAMES")
COMPLIANCE_S3_ENDPOINT_URL = env.str("COMPLIANCE_S3_ENDPOINT_URL")
COMPLIANCE_S3_TIMEOUT_S = env.int("COMPLIANCE_S3_TIMEOUT_S", 30, minimum=1)
if COMPLIANCE_STORAGE_BACKEND == "s3" and set(COMPLIANCE_S3_BUCKETS) != set(COMPLIANCE_REGIONS):
    raise ImproperlyConfigured(
        "COMPLIANCE_S3_BUCKETS must name exactly one bucket per region in COMPLIANCE_REGIONS"
    )
COMPLIANCE_OBJECT_MAX_BYTES = env.int("COMPLIANCE_OBJECT_MAX_BYTES", TRAFFIC_UPLOAD_MAX_BYTES, minimum=1)
COMPLIANCE_SAMPLE_RETENTION_DAYS = env.int("COMPLIANCE_SAMPLE_RETENTION_DAYS", 30, minimum=1)
COMPLIANCE_METRIC_RETENTION_DAYS = env.int("COMPLIANCE_METRIC_RETENTION_DAYS", 400, minimum=35)
# Idle sessions end after this long; requests marked as background polling do not count.
SESSION_IDLE_TIMEOUT_S = env.int("SESSION_IDLE_TIMEOUT_S", 30 * 60, minimum=60)
# Sign-in throttling (compliance/auth.py): failures are free up to LOGIN_THROTTLE_FAILURES per
# account from one address, LOGIN_THROTTLE_ACCOUNT_FAILURES per account from anywhere and
# LOGIN_THROTTLE_ADDRESS_FAILURES per address for any account, within the window; beyond that each
# attempt waits a back-off doubling from BASE to MAX after the scope's latest failure. MAX bounds
# how long anyone else's wrong guesses can keep a correct password out.
LOGIN_THROTTLE_FAILURES = env.int("LOGIN_THROTTLE_FAILURES", 5, minimum=1)
LOGIN_THROTTLE_ACCOUNT_FAILURES = env.int(
    "LOGIN_THROTTLE_ACCOUNT_FAILURES", 4 * LOGIN_THROTTLE_FAILURES, minimum=LOGIN_THROTTLE_FAILURES
)
LOGIN_THROTTLE_ADDRESS_FAILURES = env.int(
    "LOGIN_THROTTLE_ADDRESS_FAILURES", 4 * LOGIN_THROTTLE_FAILURES, minimum=LOGIN_THROTTLE_FAILURES
)
LOGIN_THROTTLE_WINDOW_S = env.int("LOGIN_THROTTLE_WINDOW_S", 15 * 60, minimum=1)
LOGIN_THROTTLE_BASE_DELAY_S = env.int("LOGIN_THROTTLE_BASE_DELAY_S", 1, minimum=1)
LOGIN_THROTTLE_MAX_DELAY_S = env.int("LOGIN_THROTTLE_MAX_DELAY_S", 60, minimum=LOGIN_THROTTLE_BASE_DELAY_S)
# Reverse proxies (addresses or CIDRs) whose X-Forwarded-For names the client: behind the TLS
# proxy, throttling and the audit trail see each client's own address, not the proxy's.
TRUSTED_PROXIES = env.networks("TRUSTED_PROXIES", [])
# The throttled backend signs people in; ModelBackend stays listed for sessions it started.
AUTHENTICATION_BACKENDS = [
    "compliance.auth.ThrottledModelBackend",
    "django.contrib.auth.backends.ModelBackend",
]
MIDDLEWARE.append("compliance.middleware.ComplianceMiddleware")
# Sensitive actions need the password (and two-factor code) again (portal/accounts/reauth.py);
# after the two-factor middleware, so a session has passed its two-factor step by then.
MIDDLEWARE.append("portal.accounts.reauth.ReauthMiddleware")
# How long a sign-in or a re-authentication counts as fresh for those actions.
REAUTH_MAX_AGE_S = env.int("REAUTH_MAX_AGE_S", 600, minimum=60)
CELERY_BEAT_SCHEDULE["compliance-retention"] = {
    "task": "compliance.tasks.retention_enforce",
    "schedule": 3600.0,
}
CELERY_BEAT_SCHEDULE["compliance-audit-verify"] = {
    "task": "compliance.tasks.audit_verify",
    "schedule": 24 * 3600.0,
}
# The audit chains' heads, written outside the database (compliance/anchor.py).
CELERY_BEAT_SCHEDULE["compliance-audit-anchor"] = {
    "task": "compliance.tasks.audit_anchor",
    "schedule": float(env.int("COMPLIANCE_AUDIT_ANCHOR_INTERVAL_S", 3600, minimum=60)),
}
# How long an anchor stays undeletable where the bucket has S3 Object Lock (compliance mode).
COMPLIANCE_AUDIT_ANCHOR_RETENTION_DAYS = env.int("COMPLIANCE_AUDIT_ANCHOR_RETENTION_DAYS", 7 * 366, minimum=1)
CELERY_BEAT_SCHEDULE["compliance-sla-close"] = {
    "task": "portal.sla.tasks.sla_windows_close",
    "schedule": 3600.0,
}
# Snapshots further apart than this leave a gap between them (the scraper was away).
COMPLIANCE_SLA_MAX_INTERVAL_S = env.int("COMPLIANCE_SLA_MAX_INTERVAL_S", 120, minimum=1)

# --- Billing (issue 10): Stripe. Off unless STRIPE_SECRET_KEY is set; then the webhook secret
# and at least one plan are required too, so a half-configured billing never starts. ----------
STRIPE_SECRET_KEY = env.str("STRIPE_SECRET_KEY")
STRIPE_WEBHOOK_SECRET = env.str("STRIPE_WEBHOOK_SECRET")
# Plans as `name=price_id` pairs (the recurring fee); metered prices (usage) go on every
# subscription so that what is reported to the meters is billed.
STRIPE_PRICE_PLANS: dict[str, str] = {}
for _plan_item in env.list("STRIPE_PRICE_PLANS", []):
    _plan, _sep, _price = _plan_item.partition("=")
    if not _sep or not _plan.strip() or not _price.strip():
        raise ImproperlyConfigured(
            f"environment variable STRIPE_PRICE_PLANS: {_plan_item!r} is not name=price_id"
        )
    STRIPE_PRICE_PLANS[_plan.strip()] = _price.strip()
STRIPE_PRICE_METERED = env.list("STRIPE_PRICE_METERED", [])
_billing_vars = {
    "STRIPE_SECRET_KEY": STRIPE_SECRET_KEY,
    "STRIPE_WEBHOOK_SECRET": STRIPE_WEBHOOK_SECRET,
    "STRIPE_PRICE_PLANS": STRIPE_PRICE_PLANS,
}
if any(_billing_vars.values()) or STRIPE_PRICE_METERED:
    _missing = [name for name, value in _billing_vars.items() if not value]
    if _missing:
        raise ImproperlyConfigured(
            f"billing is partly configured: set {', '.join(_missing)} too (or none of them)"
        )
if STRIPE_SECRET_KEY is not None and STRIPE_SECRET_KEY.startswith("pk_"):
    raise ImproperlyConfigured("STRIPE_SECRET_KEY holds a publishable key (pk_...); use the secret key")
STRIPE_API_BASE = (env.str("STRIPE_API_BASE", "https://api.stripe.com") or "").rstrip("/")
if not STRIPE_API_BASE.startswith(("https://", "http://")):
    raise ImproperlyConfigured(
        f"environment variable STRIPE_API_BASE={STRIPE_API_BASE!r} is not an http(s) URL"
    )
STRIPE_TIMEOUT_S = env.int("STRIPE_TIMEOUT_S", 10, minimum=1)
STRIPE_MAX_NETWORK_RETRIES = env.int("STRIPE_MAX_NETWORK_RETRIES", 2, minimum=0)
# Webhook signatures dated further than this from now, in either direction, are refused.
STRIPE_WEBHOOK_TOLERANCE_S = env.int("STRIPE_WEBHOOK_TOLERANCE_S", 300, minimum=1)
# Meter event names: one meter for tuning, one per hardware type for endpoints (prefix + type).
STRIPE_METER_EVENT_TUNING = env.str("STRIPE_METER_EVENT_TUNING", "tailguard_tuning_minutes") or ""
STRIPE_METER_EVENT_ENDPOINT_PREFIX = (
    env.str("STRIPE_METER_EVENT_ENDPOINT_PREFIX", "tailguard_endpoint_minutes_") or ""
)
# An hour's usage is reported this long after the hour ends; later records go out as a correction.
BILLING_USAGE_SETTLE_S = env.int("BILLING_USAGE_SETTLE_S", 900, minimum=0)
# How far back finished tuning trials are looked for when recording trial-minutes.
BILLING_TRIAL_LOOKBACK_H = env.int("BILLING_TRIAL_LOOKBACK_H", 48, minimum=1)
CELERY_BEAT_SCHEDULE["billing-usage-report"] = {
    "task": "portal.billing.tasks.usage_report",
    "schedule": float(env.int("BILLING_REPORT_INTERVAL_S", 300, minimum=30)),
}

# --- Benchmark reports for sales engineers (issue 9) ------------------------------------------
# The tokenizer prompts are synthesised with (the same text goes to every target). Unset, a
# stand-in Llama-family tokenizer is built locally on first use; point it at the tuned model's
# tokenizer folder to make prompt lengths exact for that model.
BENCHMARK_TOKENIZER_DIR = Path(
    env.str("BENCHMARK_TOKENIZER_DIR", str(VAR_DIR / "benchmarks" / "tokenizer")) or ""
)
# Where the load generator runs, as a report's test conditions state it ("" names the host only).
BENCHMARK_CLIENT_LOCATION = env.str("BENCHMARK_CLIENT_LOCATION", "") or ""
# One load level of one target sends at most this many requests (rate x duration).
BENCHMARK_MAX_REQUESTS_PER_LEVEL = env.int("BENCHMARK_MAX_REQUESTS_PER_LEVEL", 20_000, minimum=10)
# Benchmark targets must resolve to public addresses; these networks (CIDRs, e.g. the
# 10.0.0.0/8 of an internal endpoint, or 127.0.0.0/8 for a local one) are allowed besides.
BENCHMARK_ALLOWED_NETWORKS = env.networks("BENCHMARK_ALLOWED_NETWORKS", [])

# --- SLA agreements measured at the edge, and alerts (issue 23) ------------------------------
# The measuring point in front of the endpoints (router or proxy) posts its request records to
# /sla/edge/<endpoint id>/ with "Authorization: Bearer <this>"; unset, that ingest is off (404).
SLA_EDGE_INGEST_TOKEN = env.str("SLA_EDGE_INGEST_TOKEN", "") or ""
# Where engine hosts reach this portal for that ingest (the measuring proxy the local runner puts in
# front of each endpoint posts to <this>/sla/edge/); unset, SITE_URL.
SLA_EDGE_INGEST_BASE_URL = (env.str("SLA_EDGE_INGEST_BASE_URL", "") or SITE_URL).rstrip("/")
# The image (with Tailguard installed) of the measuring proxy that Kubernetes pools run beside each
# engine; unset, endpoints on a cluster are not measured at the edge (their SLA reports say so).
EDGE_PROXY_IMAGE = env.str("EDGE_PROXY_IMAGE", "") or ""
# Edge request records are kept this long (their month is closed and frozen long before: at
# least 62 days, so the month before last is always still there to close).
SLA_EDGE_RETENTION_DAYS = env.int("SLA_EDGE_RETENTION_DAYS", 100, minimum=62)
# "SLA at risk" when the last hour spends the month's error budget this many times faster than
# the month allows (14.4: a 30-day budget gone in about two days), in tenths.
SLA_BURN_RATE_ALERT = env.int("SLA_BURN_RATE_ALERT_TENTHS", 144, minimum=10) / 10
CELERY_BEAT_SCHEDULE["sla-periods-close"] = {"task": "portal.sla.tasks.sla_periods_close", "schedule": 3600.0}
CELERY_BEAT_SCHEDULE["sla-edge-settle"] = {
    "task": "portal.sla.tasks.edge_intervals_settle",
    "schedule": 300.0,
}
CELERY_BEAT_SCHEDULE["sla-alerts-check"] = {
    "task": "portal.sla.tasks.sla_alerts_check",
    "schedule": float(env.int("SLA_ALERTS_CHECK_INTERVAL_S", 300, minimum=30)),
}
# Alert webhooks must resolve to public addresses, like benchmark targets; these networks (CIDRs)
# are allowed besides (e.g. 10.0.0.0/8 for an in-house receiver).
ALERT_WEBHOOK_ALLOWED_NETWORKS = env.networks("ALERT_WEBHOOK_ALLOWED_NETWORKS", [])
ALERT_WEBHOOK_TIMEOUT_S = env.int("ALERT_WEBHOOK_TIMEOUT_S", 10, minimum=1)
# Retries: after attempt n the next waits ALERT_RETRY_BASE_S x 2^(n-1); the delivery is kept as
# abandoned (with its last error, and can be sent again) after ALERT_MAX_ATTEMPTS.
ALERT_MAX_ATTEMPTS = env.int("ALERT_MAX_ATTEMPTS", 6, minimum=1)
ALERT_RETRY_BASE_S = env.int("ALERT_RETRY_BASE_S", 30, minimum=1)
# How far back each scan looks for finished jobs, loop steps and payment failures.
ALERT_SCAN_LOOKBACK_S = env.int("ALERT_SCAN_LOOKBACK_S", 86400, minimum=60)
CELERY_BEAT_SCHEDULE["alerts-scan"] = {
    "task": "portal.alerts.tasks.alerts_scan",
    "schedule": float(env.int("ALERT_SCAN_INTERVAL_S", 30, minimum=5)),
}

# --- Operator metrics (issue 23 item 8) -----------------------------------------------------------
# Prometheus scrapes /metrics with "Authorization: Bearer <METRICS_TOKEN>"; unset, /metrics is 404.
# Under gunicorn, also set PROMETHEUS_MULTIPROC_DIR (an empty folder the workers share).
METRICS_TOKEN = env.str("METRICS_TOKEN", "") or ""
