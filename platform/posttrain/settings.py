"""Posttrain settings: everything comes from the environment, with embedded defaults.

Embedded defaults need no server at all: SQLite, a Celery broker on SQLite (kombu's SQLAlchemy
transport), in-process pub/sub, and a local Ray head. Real servers are used when configured:

    DATABASE_URL       postgres://user@host:5432/db       (default: SQLite in POSTTRAIN_HOME)
    CELERY_BROKER_URL  redis://127.0.0.1:6379/0           (default: REDIS_URL, else SQLite broker)
    REDIS_URL          redis://127.0.0.1:6379/0           (live pub/sub; default: in-process)
    RAY_ADDRESS        http://127.0.0.1:8265              (Ray Jobs API / dashboard of the cluster)
    POSTTRAIN_HOME     folder for local state              (default: <repo>/var)
    POSTTRAIN_DEBUG    1 to turn DEBUG on                  (default: off)
    POSTTRAIN_SECRET_KEY                                   (default: a random key kept in POSTTRAIN_HOME)
    RAY_AUTH_MODE      token or disabled                   (default: token; docs/SECURITY.md, "Ray")
    POSTTRAIN_RAY_TOKEN_FILE  the Ray cluster's token      (default: generated once into POSTTRAIN_HOME/ray_token)
    POSTTRAIN_ALLOWED_HOSTS  comma-separated              (default: localhost,127.0.0.1)
    POSTTRAIN_IMPORT_ROOTS   server folders users may name  (default: <storage>/imports; docs/SECURITY.md)
    POSTTRAIN_HTTP_ALLOW     hosts/CIDRs rewards may reach although private or the cluster's (default: none)
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import dj_database_url

REPO_ROOT = Path(__file__).resolve().parents[2]
STATE_DIR = Path(os.environ.get("POSTTRAIN_HOME", REPO_ROOT / "var")).resolve()
STATE_DIR.mkdir(parents=True, exist_ok=True)


def _env_flag(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _state_secret(name: str, generate: Callable[[], str]) -> Path:
    """`STATE_DIR/<name>`, generated once per state folder (never committed anywhere) and readable by this OS user
    only. It is written whole into a private temporary file (mkstemp makes it 0600) and linked into place, so no
    reader ever sees it half-written or open to others, and of two processes starting at once (`make demo`
    starts the web server and two workers together) both keep the first one's."""
    path = STATE_DIR / name
    if path.exists():
        return path
    handle, draft = tempfile.mkstemp(dir=STATE_DIR, prefix=f".{name}.")
    try:
        with os.fdopen(handle, "w") as file:
            file.write(generate())
        with contextlib.suppress(FileExistsError):
            os.link(draft, path)
    finally:
        os.unlink(draft)
    return path


def _secret_key() -> str:
    """The configured key, else one generated once per state folder."""
    configured = os.environ.get("POSTTRAIN_SECRET_KEY")
    if configured:
        return configured
    return _state_secret("secret_key", lambda: secrets.token_urlsafe(50)).read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = _env_flag("POSTTRAIN_DEBUG")
ALLOWED_HOSTS = [
    h.strip() for h in os.environ.get("POSTTRAIN_ALLOWED_HOSTS", "localhost,127.0.0.1").split(",") if h.strip()
]
CSRF_TRUSTED_ORIGINS = [o.strip() for o in os.environ.get("POSTTRAIN_CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "posttrain.core",
    "posttrain.accounts",
    "posttrain.projects",
    "posttrain.registry",
    "posttrain.runs",
    "posttrain.telemetry",
    "posttrain.scheduling",
    "posttrain.review",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "posttrain.core.middleware.DatabaseUnavailableMiddleware",  # 503, not 500, while the database is down
]

ROOT_URLCONF = "posttrain.urls"
ASGI_APPLICATION = "posttrain.asgi.application"
WSGI_APPLICATION = "posttrain.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [REPO_ROOT / "frontend" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "posttrain.projects.context_processors.project_switcher",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{STATE_DIR / 'posttrain.sqlite3'}",
        conn_max_age=int(os.environ.get("POSTTRAIN_DB_CONN_MAX_AGE", "0")),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The embedded default is written by the web server (event ingestion) and the worker at once:
    # WAL lets readers go on during a write, and IMMEDIATE transactions wait for the lock instead
    # of failing mid-transaction with "database is locked".
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = STATE_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)  # WhiteNoise warns about a missing one


def _plotly_js_dir() -> Path:
    """plotly.js as the pinned plotly Python package ships it (the machines are offline: no CDN)."""
    import importlib.util

    spec = importlib.util.find_spec("plotly")
    assert spec is not None and spec.submodule_search_locations, "the plotly package is missing"
    return Path(next(iter(spec.submodule_search_locations))) / "package_data"


STATICFILES_DIRS = [REPO_ROOT / "frontend" / "static", ("vendor/plotly", _plotly_js_dir())]
# Static files are served by WhiteNoise straight from the finders (frontend/static and the apps'),
# so neither the demo nor the tests need a collectstatic step.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.TokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": [
        "posttrain.core.api.parsers.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_SCHEMA_CLASS": "posttrain.core.api.schema.AutoSchema",
    # One error shape for every API: {"errors": [{"loc", "msg"}]} (docs/ARCHITECTURE.md, "The error contract").
    "EXCEPTION_HANDLER": "posttrain.core.api.errors.api_exception_handler",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Posttrain API",
    "DESCRIPTION": "Models, datasets, rewards, experiments and runs for RL post-training.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # One enum for the run state wherever it appears (state, from_state, to_state).
    "ENUM_NAME_OVERRIDES": {"RunStateEnum": "posttrain.runs.models.RunState"},
}

# --- Celery ---------------------------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "")
CELERY_BROKER_URL = (
    os.environ.get("CELERY_BROKER_URL") or REDIS_URL or (f"sqla+sqlite:///{STATE_DIR / 'celery-broker.sqlite3'}")
)
CELERY_TASK_IGNORE_RESULT = True  # tasks report through the database, not a result backend
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND") or None
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Tasks are sent by name (posttrain.core.task_queue), which Celery's eager mode does not apply to: no EAGER flag.

# --- Artifacts (docs/ARCHITECTURE.md, "Artifacts"): runs/<run-id>/, datasets/<sha256>/, models/<name>/ ---
STORAGE_ROOT = Path(os.environ.get("POSTTRAIN_STORAGE", STATE_DIR / "storage")).resolve()
# The server folders a user may name a path in (a dataset, a model folder, a reward file, a run's eval data,
# tokenizer, environment or agent files), os.pathsep-separated; symlinks are resolved first
# (posttrain.core.server_paths, docs/SECURITY.md). The platform's own state is never readable through them.
IMPORT_ROOTS = [
    Path(root).expanduser().resolve()
    for root in os.environ.get("POSTTRAIN_IMPORT_ROOTS", str(STORAGE_ROOT / "imports")).split(os.pathsep)
    if root.strip()
]
# Hosts and networks (CIDR) a reward's outbound request may reach although they are loopback, link-local,
# private or the cluster's own (comma- or space-separated); everything else of that kind is refused
# (rl_engine/outbound.py). Runs get the same list.
HTTP_ALLOW = [item for item in os.environ.get("POSTTRAIN_HTTP_ALLOW", "").replace(",", " ").split() if item]
# Where each run's rollout files go (docs/ROLLOUTS.md): `<store>/runs/<run id>/rollouts/step_<n>.parquet`. A folder
# (default: the storage root, which the Ray cluster shares) or an fsspec URL such as s3://bucket/prefix (the
# `bucket` extra installs s3fs; credentials from the usual AWS_* variables, for web, workers and engine alike).
ROLLOUT_STORE = os.environ.get("POSTTRAIN_ROLLOUT_STORE") or str(STORAGE_ROOT)
# A run's prompt ledger file (a few integers per dataset row and epoch) is served up to this size.
LEDGER_MAX_BYTES = int(os.environ.get("POSTTRAIN_LEDGER_MAX_BYTES", str(256 * 1024 * 1024)))
# The largest rollout file an external run may upload (one step's rollouts, compressed).
ROLLOUT_UPLOAD_MAX_BYTES = int(os.environ.get("POSTTRAIN_ROLLOUT_UPLOAD_MAX_BYTES", str(512 * 1024 * 1024)))
# A review campaign over more rollouts than this (its runs' files at its steps, by the index) is built on a
# worker (`workers.review_campaign_build`), the campaign `building` until then; smaller ones in the request.
REVIEW_CAMPAIGN_INLINE_MAX_ROLLOUTS = int(os.environ.get("POSTTRAIN_REVIEW_CAMPAIGN_INLINE_ROLLOUTS", "200000"))
DATASET_MAX_BYTES = int(os.environ.get("POSTTRAIN_DATASET_MAX_BYTES", str(200 * 1024 * 1024)))
# Where a run's engine posts its events: this server as the Ray job's machine can reach it.
PUBLIC_URL = os.environ.get("POSTTRAIN_PUBLIC_URL", "http://127.0.0.1:8000").rstrip("/")
# The Python that runs the engine inside a Ray job (the head's environment for a local head).
ENGINE_PYTHON = os.environ.get("POSTTRAIN_ENGINE_PYTHON", sys.executable)
# How long a launched run may wait for Ray to accept its job (head starting, cluster busy) before it fails.
RUN_SUBMIT_TIMEOUT_S = float(os.environ.get("POSTTRAIN_RUN_SUBMIT_TIMEOUT_S", "600"))
RUN_HEARTBEAT_TIMEOUT_S = float(os.environ.get("POSTTRAIN_RUN_HEARTBEAT_TIMEOUT_S", "120"))
# The worker's Ray Jobs client (posttrain.scheduling.services.jobs_api.JobsClient), named here so the platform never
# imports the workers package that imports it.
RUNS_JOBS_CLIENT = "workers.ray_jobs"
# The worker's reader of the Ray cluster's total and free resources (`cluster_view()`), for admission.
RUNS_CLUSTER_VIEW = "workers.ray_cluster"
# A run still queued this long after launch lost its submit task (its worker died holding it): the reconcile
# submits it again (idempotent: submission id = run id), so another worker takes over.
RUN_QUEUED_GRACE_S = float(os.environ.get("POSTTRAIN_RUN_QUEUED_GRACE_S", "60"))
# User code (python rewards, environments, agent commands) runs in a bubblewrap sandbox and is refused
# where none can be made; an admin may allow it unsandboxed on a single-user machine (shown on /api/health/).
# The engine and the workers read the same variable (rl_engine.sandbox); runs' jobs get it passed on.
ALLOW_UNSANDBOXED_CODE = _env_flag("POSTTRAIN_ALLOW_UNSANDBOXED_CODE")
# A reward's "Try it" and the import check of new python source run on a Celery worker; the request waits this
# long for the outcome (a try then answers 202 with the trial to poll; a check answers 503).
REWARD_TRY_WAIT_S = float(os.environ.get("POSTTRAIN_REWARD_TRY_WAIT_S", "60"))
REWARD_CHECK_QUEUE_S = float(os.environ.get("POSTTRAIN_REWARD_CHECK_QUEUE_S", "30"))
# A reward probe nobody waits for: a probe no user-code worker took within this long is failed (beat).
REWARD_PROBE_QUEUE_S = float(os.environ.get("POSTTRAIN_REWARD_PROBE_QUEUE_S", "600"))
# User code a web request asks for (an import check, a "Try it") runs on a Celery queue of its own, served by
# a worker of its own (`-Q user_code`, prefork pool), so it never delays run submission or admission. Celery
# raises SoftTimeLimitExceeded in the task at the soft limit and kills the worker's child at the hard one; a
# job of any kind still unfinished then is failed by the periodic check (posttrain.core.job_runner).
USER_CODE_QUEUE = "user_code"
USER_CODE_SOFT_TIME_LIMIT_S = float(os.environ.get("POSTTRAIN_USER_CODE_SOFT_TIME_LIMIT_S", "120"))
USER_CODE_TIME_LIMIT_S = float(os.environ.get("POSTTRAIN_USER_CODE_TIME_LIMIT_S", "150"))
# User-code jobs over many items (a review judge scoring a campaign, an installed environment generating its
# dataset; each sandboxed call under its own deadline) have a limit of their own, sized for hundreds of items.
USER_CODE_LONG_SOFT_TIME_LIMIT_S = float(os.environ.get("POSTTRAIN_USER_CODE_LONG_SOFT_TIME_LIMIT_S", "1800"))
USER_CODE_LONG_TIME_LIMIT_S = float(os.environ.get("POSTTRAIN_USER_CODE_LONG_TIME_LIMIT_S", "1830"))
# Such a job (nobody waits on it in a request) may queue behind others this long before none will take it.
USER_CODE_LONG_QUEUE_S = float(os.environ.get("POSTTRAIN_USER_CODE_LONG_QUEUE_S", str(24 * 3600)))
# GGUF imports (docs/SECURITY.md, "GGUF imports"): a GGUF file uploaded (at most GGUF_IMPORT_MAX_BYTES) or named on
# the server becomes a model folder of the models store, converted on the user-code worker in the engine's sandbox
# under a memory cap (the sandbox's cgroup and each process's address space) and a deadline; the worker's task gets
# the deadline plus GGUF_IMPORT_COPY_S for copying a server file in and moving the result into place.
GGUF_IMPORT_MAX_BYTES = int(os.environ.get("POSTTRAIN_GGUF_MAX_BYTES", str(8 << 30)))
GGUF_IMPORT_MEMORY_MB = int(os.environ.get("POSTTRAIN_GGUF_MEMORY_MB", "16384"))
GGUF_IMPORT_TIMEOUT_S = float(os.environ.get("POSTTRAIN_GGUF_TIMEOUT_S", "3600"))
GGUF_IMPORT_COPY_S = float(os.environ.get("POSTTRAIN_GGUF_COPY_S", "600"))
GGUF_IMPORT_CPUS = float(os.environ.get("POSTTRAIN_GGUF_CPUS", "2"))
# The dtype of the converted weights: `auto` is the worker machine's training dtype (bfloat16 where it computes in
# it natively: a CUDA GPU that does, or a CPU with AVX512-BF16/AMX-BF16; float32 elsewhere).
GGUF_IMPORT_DTYPE = os.environ.get("POSTTRAIN_GGUF_DTYPE", "auto").strip().lower()
if GGUF_IMPORT_DTYPE not in ("auto", "float32", "bfloat16", "float16"):
    raise ValueError(f"POSTTRAIN_GGUF_DTYPE must be auto, float32, bfloat16 or float16, got {GGUF_IMPORT_DTYPE!r}")
# After converting, the model answers a prompt with transformers; with vLLM too where this is on and vLLM is
# installed (about a minute more; the tests turn it off).
GGUF_IMPORT_CHECK_VLLM = _env_flag("POSTTRAIN_GGUF_CHECK_VLLM", True)
# An import no user-code worker took within this long is failed (beat).
GGUF_IMPORT_QUEUE_S = float(os.environ.get("POSTTRAIN_GGUF_QUEUE_S", str(24 * 3600)))
# Routed by name: the web process sends tasks by name too.
CELERY_TASK_ROUTES = {
    name: {"queue": USER_CODE_QUEUE}
    for name in (
        "workers.reward_trial_run",
        "workers.reward_probe_run",
        "workers.review_judge_run",
        "workers.environment_generate",
        "workers.environment_trial_run",
        "workers.model_import_run",
    )
}
# Largest event batch the ingestion endpoint reads (a step's samples can be several MB).
INGEST_MAX_BODY_BYTES = int(os.environ.get("POSTTRAIN_INGEST_MAX_BODY_BYTES", str(64 * 1024 * 1024)))

# --- Request bodies (docs/SECURITY.md, "Request bodies") ---------------------------------------------------------
# The most bytes of body each kind of route takes, enforced in front of Django before a byte is read (Django's ASGI
# handler spools any body to a temporary file before a view could refuse it): a declared Content-Length over the
# cap is refused at once, a streamed body past it is cut off; which routes get which cap is
# posttrain.core.request_bounds.ROUTES. The run's and the dataset's follow the limits their views apply.
_MiB = 1 << 20
REQUEST_BODY_MAX_BYTES = {
    "events": INGEST_MAX_BODY_BYTES,  # POST /api/runs/<id>/events, the run's token
    "rollout_upload": ROLLOUT_UPLOAD_MAX_BYTES,  # PUT /api/runs/<id>/rollouts/<name>/upload, the run's token
    "dataset_upload": DATASET_MAX_BYTES + _MiB,  # POST /api/datasets/: the file plus the multipart form around it
    "gguf_upload": GGUF_IMPORT_MAX_BYTES + _MiB,  # POST /api/models/import-gguf/: the GGUF and its form
    # /api/rewards/… and /api/environments/…: a python reward's source inline (a server file may be 1 MiB; JSON
    # escapes it), a "Try it" of 32 samples, an environment's 32 moves of up to 20,000 characters each.
    "user_code": int(os.environ.get("POSTTRAIN_USER_CODE_BODY_MAX_BYTES", str(4 * _MiB))),
    # Every other API body: the largest is an external run's config (1 MiB of JSON, its own limit) with its fields.
    "api_json": int(os.environ.get("POSTTRAIN_API_BODY_MAX_BYTES", str(2 * _MiB))),
    "form": int(os.environ.get("POSTTRAIN_FORM_BODY_MAX_BYTES", str(256 * 1024))),  # HTML form posts (the admin)
    "login": 16 * 1024,  # POST /api/auth/token/, /login/, /admin/login/, /logout/: open to anyone
    "safe_method": 64 * 1024,  # a GET, HEAD or OPTIONS request has no use for a body
}
# Django's own limits stay at their defaults: a body up to FILE_UPLOAD_MAX_MEMORY_SIZE (2.5 MiB) is held in memory,
# a larger one spooled to a temporary file (at most its cap, above); DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MiB) bounds
# form fields, which the caps of the login and form routes keep far under.
# Run states against Ray job states (lost heartbeats, jobs that ended without a final event).
RUN_RECONCILE_INTERVAL_S = float(os.environ.get("POSTTRAIN_RUN_RECONCILE_INTERVAL_S", "15"))
CELERY_BEAT_SCHEDULE = {
    "runs-reconcile": {
        "task": "workers.runs_reconcile",
        "schedule": RUN_RECONCILE_INTERVAL_S,
        "options": {"expires": RUN_RECONCILE_INTERVAL_S},  # a backlog of checks is pointless
    },
    "worker-jobs-expire": {
        "task": "workers.worker_jobs_expire",
        "schedule": 30.0,
        "options": {"expires": 30.0},
    },
}

# --- Live pub/sub and Ray -----------------------------------------------------------------------
PUBSUB_BACKEND = "redis" if REDIS_URL else "inprocess"
# The run page's Server-Sent Events: a comment every KEEPALIVE_S keeps proxies from closing an idle
# stream; a stream ends after MAX_STREAM_S (workers can recycle) and EventSource resumes it by itself.
SSE_KEEPALIVE_S = float(os.environ.get("POSTTRAIN_SSE_KEEPALIVE_S", "15"))
SSE_MAX_STREAM_S = float(os.environ.get("POSTTRAIN_SSE_MAX_STREAM_S", "300"))
RAY_ADDRESS = os.environ.get("RAY_ADDRESS", "http://127.0.0.1:8265")
# Ray's token authentication (docs/SECURITY.md, "Ray"): Ray's own variable, read by the Ray processes and by the
# platform alike. `token` (the default): the platform sends the cluster's token with every request to the
# dashboard and Jobs API, and `make demo` starts its head with it; `disabled` is an admin's explicit opt-out
# (anyone who reaches the head's ports runs code as the platform), logged at every start and shown on /api/health/.
RAY_AUTH_MODE = os.environ.get("RAY_AUTH_MODE", "token").strip().lower()
if RAY_AUTH_MODE not in ("token", "disabled"):
    raise ValueError(f"RAY_AUTH_MODE must be token or disabled, got {RAY_AUTH_MODE!r}")
# The cluster's token: a file of the operator's for a cluster of their own (POSTTRAIN_RAY_TOKEN_FILE, the file the
# nodes' RAY_AUTH_TOKEN_PATH names), else one generated once next to the secret key, which `make demo` gives its
# head. The file's path is all any process is handed, never the token.
_OPERATORS_RAY_TOKEN_FILE = os.environ.get("POSTTRAIN_RAY_TOKEN_FILE", "").strip()
if _OPERATORS_RAY_TOKEN_FILE:
    RAY_TOKEN_FILE = Path(_OPERATORS_RAY_TOKEN_FILE).expanduser()
elif RAY_AUTH_MODE == "token":
    RAY_TOKEN_FILE = _state_secret("ray_token", lambda: secrets.token_hex(32))  # the format of Ray's own tokens
else:
    RAY_TOKEN_FILE = STATE_DIR / "ray_token"
# The scheduler (docs/ARCHITECTURE.md, "The scheduler"): `admission` submits a queued run only when the
# cluster holds it now, in priority / fair-share / age order; `all-at-once` submits every run at launch
# and leaves the waiting to Ray (the old behaviour, kept for bench/queue_admission.py).
SCHEDULER = os.environ.get("POSTTRAIN_SCHEDULER", "admission")
if SCHEDULER not in ("admission", "all-at-once"):
    raise ValueError(f"POSTTRAIN_SCHEDULER must be admission or all-at-once, got {SCHEDULER!r}")
# Aging: a waiting run gains one priority level per this many seconds of waiting, so nothing starves.
SCHEDULER_AGING_S = float(os.environ.get("POSTTRAIN_SCHEDULER_AGING_S", "1800"))
# Preemption: a run that cannot fit may preempt lower-priority runs (0 turns it off).
SCHEDULER_PREEMPTION = _env_flag("POSTTRAIN_SCHEDULER_PREEMPTION", True)
# Backfill (docs/SCHEDULER.md): a run starts ahead of waiting runs when it ends before it could delay them
# (0: the first run in order that does not start holds everyone behind it).
SCHEDULER_BACKFILL = _env_flag("POSTTRAIN_SCHEDULER_BACKFILL", True)
# The preemption deadline: a preempting run still going after this many seconds has its job stopped, and
# resumes from its last checkpoint (the steps after it are lost, counted and shown).
SCHEDULER_PREEMPT_GRACE_S = float(os.environ.get("POSTTRAIN_SCHEDULER_PREEMPT_GRACE_S", "300"))
# Fair share over time: usage counts with this half-life (Slurm's PriorityDecayHalfLife; 7 days there).
SCHEDULER_USAGE_HALF_LIFE_S = float(os.environ.get("POSTTRAIN_SCHEDULER_USAGE_HALF_LIFE_S", str(7 * 86400)))
# Cluster samples (utilisation over time) older than this are deleted.
SCHEDULER_SAMPLES_KEEP_S = float(os.environ.get("POSTTRAIN_SCHEDULER_SAMPLES_KEEP_S", str(30 * 86400)))
HEALTH_CHECK_TIMEOUT_S = float(os.environ.get("POSTTRAIN_HEALTH_TIMEOUT_S", "2"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("POSTTRAIN_LOG_LEVEL", "INFO")},
}
