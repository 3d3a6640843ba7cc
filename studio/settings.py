"""Studio settings, read from the environment (see README.md for every variable)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import tempfile
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from studio.env import (
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_secret,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent

# Off unless asked for: a debug page shows settings and the environment
# (DATABASE_URL's password included) to anyone who sends a wrong Host.
DEBUG = env_bool("DJANGO_DEBUG", False)


# Where a generated key is kept: by default an ignored file in the checkout
# (development, `make run`), in production the one the example environment
# names. Several machines must share one key: set DJANGO_SECRET_KEY (or a
# file they share) there. (MCP servers' sandboxes never show this file.)
SECRET_KEY_FILE = Path(env_str("DJANGO_SECRET_KEY_FILE") or BASE_DIR / ".secret_key")


def _secret_key() -> str:
    key = env_str("DJANGO_SECRET_KEY")
    if key:
        return key
    path = SECRET_KEY_FILE
    try:
        key = path.read_text().strip()
    except FileNotFoundError:
        key = ""
    if key:
        return key
    # Written whole, then linked into place: processes starting together all
    # read the one key that won.
    fd, temporary = tempfile.mkstemp(prefix=".secret_key.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(50))
        with contextlib.suppress(FileExistsError):
            os.link(temporary, path)
    finally:
        os.unlink(temporary)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "studio.admin.StudioAdminConfig",  # django.contrib.admin, with Studio's site
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "axes",
    "django_htmx",
    "chat",
    "approvals",
]

MIDDLEWARE = [
    # First: every line logged while a request is served carries its id.
    "studio.logs.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    # Last of the others, as django-axes asks: turns a lockout into its 429 page.
    "axes.middleware.AxesMiddleware",
    "studio.middleware.OneThreadHop",
]

AUTHENTICATION_BACKENDS = [
    # First: refuses a locked-out login before any password is checked.
    "axes.backends.AxesStandaloneBackend",
    # Refuses passwords when STUDIO_PASSWORD_LOGIN is off, but the break-glass account's.
    "approvals.signin.PasswordsOff",
    "django.contrib.auth.backends.ModelBackend",
]

# Sign-in with the team's OpenID Connect provider (approvals/signin.py). Unset
# issuer: only passwords, as before.
STUDIO_OIDC_ISSUER = env_str("STUDIO_OIDC_ISSUER").rstrip("/")
STUDIO_OIDC_LABEL = env_str("STUDIO_OIDC_LABEL", "your team's sign-in")
# The claim that names the member in Studio (their username); the provider's
# ``sub`` is what links the account, so a renamed member stays who they were.
STUDIO_OIDC_USERNAME_CLAIM = env_str("STUDIO_OIDC_USERNAME_CLAIM", "preferred_username")
STUDIO_OIDC_GROUPS_CLAIM = env_str("STUDIO_OIDC_GROUPS_CLAIM", "groups")
# Provider groups (comma-separated) whose members get each role at each login.
STUDIO_OIDC_REVIEWER_GROUPS = env_list("STUDIO_OIDC_REVIEWER_GROUPS", [])
STUDIO_OIDC_STAFF_GROUPS = env_list("STUDIO_OIDC_STAFF_GROUPS", [])
STUDIO_OIDC_SUPERUSER_GROUPS = env_list("STUDIO_OIDC_SUPERUSER_GROUPS", [])
# A first sign-in may take over a local account with the same verified email.
STUDIO_OIDC_LINK_BY_EMAIL = env_bool("STUDIO_OIDC_LINK_BY_EMAIL", False)
# Off: the password form is hidden and refused, but for this one superuser.
STUDIO_PASSWORD_LOGIN = env_bool("STUDIO_PASSWORD_LOGIN", True)
STUDIO_BREAK_GLASS_USER = env_str("STUDIO_BREAK_GLASS_USER")
# mozilla-django-oidc's settings, from Studio's; its backend signs nobody in
# while STUDIO_OIDC_ISSUER is unset.
AUTHENTICATION_BACKENDS.append("approvals.signin.ProviderBackend")
OIDC_RP_CLIENT_ID = env_str("STUDIO_OIDC_CLIENT_ID")
OIDC_RP_CLIENT_SECRET = env_secret("STUDIO_OIDC_CLIENT_SECRET", "STUDIO_OIDC_CLIENT_SECRET_FILE")
OIDC_RP_SCOPES = env_str("STUDIO_OIDC_SCOPES", "openid email profile groups")
OIDC_RP_SIGN_ALGO = env_str("STUDIO_OIDC_SIGN_ALGO", "RS256")
OIDC_USE_PKCE = True
OIDC_USE_NONCE = True
OIDC_STORE_ID_TOKEN = True  # the hint for the provider's logout
OIDC_TIMEOUT = env_float("STUDIO_OIDC_TIMEOUT_SECONDS", 10, minimum=0.1)
# Endpoints come from the provider's discovery document (approvals/signin.py).
OIDC_OP_AUTHORIZATION_ENDPOINT = OIDC_OP_TOKEN_ENDPOINT = ""
OIDC_OP_USER_ENDPOINT = OIDC_OP_JWKS_ENDPOINT = ""
# Login throttling for a team app: a username is locked for a while after a
# few failures *from one address*, so nobody can lock a colleague out from
# elsewhere by guessing at their name.
AXES_FAILURE_LIMIT = env_int("STUDIO_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_float("STUDIO_LOGIN_COOLOFF_MINUTES", 15, minimum=0.01))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_CLIENT_IP_CALLABLE = "studio.http.client_ip"
AXES_VERBOSE = False

ROOT_URLCONF = "studio.urls"
ASGI_APPLICATION = "studio.asgi.application"

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
                "approvals.context_processors.inbox",
            ],
            # Tags shared by every app's templates (studio is not an app).
            "libraries": {"studio_tags": "studio.templatetags"},
        },
    },
]

# Database: SQLite file by default, anything dj-database-url reads otherwise.
DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    try:
        _db = dj_database_url.parse(DATABASE_URL, conn_max_age=0)
    except Exception as exc:  # dj-database-url raises a bare ValueError/KeyError
        raise ImproperlyConfigured(f"DATABASE_URL is not a valid database URL: {exc}") from None
else:
    _db = {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "db.sqlite3"}
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # Each worker thread keeps its connection: opening one costs more than a
    # decision does.
    _db["CONN_MAX_AGE"] = None
    # Django's own backend, configured through its documented OPTIONS.
    # IMMEDIATE takes the write lock at BEGIN, so racing writers queue on the
    # timeout instead of failing with "database is locked" on upgrade.
    _db.setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": env_float("STUDIO_SQLITE_TIMEOUT", 20),
            # WAL: readers never block the writer, and a commit is an append
            # (synced at checkpoints) instead of two fsyncs of a rollback journal.
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
    # Tests use a file, not shared-cache memory: threads and child processes
    # must see the same database and honour the busy timeout.
    _db["TEST"] = {
        "NAME": str(BASE_DIR / f".test-{env_str('STUDIO_TEST_DB_SUFFIX', 'db')}.sqlite3")
    }
if _db["ENGINE"] == "django.db.backends.postgresql":
    # A pool: each step of a run gives its connection back when it ends (a
    # waiting run holds none) and takes one back cheaply; a burst of resumed
    # runs queues for a connection instead of failing.
    _db.setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": env_int("STUDIO_DB_POOL_SIZE", 20, minimum=2),
        # How long a request or a step waits for a connection (a burst, or
        # PostgreSQL down) before it fails.
        "timeout": env_float("STUDIO_DB_POOL_TIMEOUT", 60, minimum=0.1),
    }
    if env_bool("STUDIO_DB_PREPARED_STATEMENTS", True):
        # Every catch-up and every decision repeats the same few queries:
        # bound on the server, psycopg prepares each after its fifth use on a
        # connection, and PostgreSQL parses and plans it no more. Off behind a
        # pooler that cannot keep prepared statements (PgBouncer's transaction mode).
        _db["OPTIONS"].update({"server_side_binding": True, "prepare_threshold": 5})
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Channel layer: in-memory for one process, Redis for several.
REDIS_URL = env_str("REDIS_URL")


def _channel_prefix() -> str:
    """This deployment's namespace on the Redis server: every group and channel carries it.

    Redis Pub/Sub ignores the database number, so deployments sharing a Redis
    server would see each other's events under one prefix. The default differs
    wherever the database or the Redis server or database number differs.
    """
    explicit = env_str("STUDIO_CHANNEL_PREFIX")
    if explicit:
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", explicit):
            raise ImproperlyConfigured(
                "STUDIO_CHANNEL_PREFIX must be 1 to 40 letters, digits, '-' or '_', "
                f"got {explicit!r}"
            )
        return explicit
    redis = urlsplit(REDIS_URL)
    identity = [
        _db["ENGINE"],
        str(_db.get("HOST") or ""),
        str(_db.get("PORT") or ""),
        str(_db["NAME"]),
        redis.hostname or "",
        str(redis.port or ""),
        redis.path,
    ]
    return "studio-" + hashlib.sha256("\0".join(identity).encode()).hexdigest()[:12]


STUDIO_CHANNEL_PREFIX = _channel_prefix()
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # Pub/Sub: one PUBLISH per message, delivered to whichever process
            # listens right now. A hop costs 0.2 ms here against the core
            # layer's 1.2 to 1.7 ms (bench/layer_hop.py), and an approval
            # across processes needs several hops in a row. Nothing is kept
            # for a listener that is away; Studio needs nothing kept: delivery
            # is at most once by design, the database row is the truth.
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {
                # redis-py 8 defaults to a 5 s socket timeout, which kills
                # every idle receive(); None waits as long as needed.
                "hosts": [{"address": REDIS_URL, "socket_timeout": None}],
                "prefix": STUDIO_CHANNEL_PREFIX,
            },
        }
    }
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels.layers.InMemoryChannelLayer",
            "CONFIG": {"capacity": env_int("STUDIO_CHANNEL_CAPACITY", 5000, minimum=100)},
        }
    }

# Sessions in the database, which every process shares: a logout is seen
# everywhere at once. Not through Django's Redis cache: under ASGI each
# request and each socket would open Redis connections of its own (Django
# ticket #35651; bench/RESULTS.md), and nothing else here uses a cache.
SESSION_ENGINE = "django.contrib.sessions.backends.db"
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "chat:index"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("STUDIO_TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# Where manage.py collectstatic gathers the files for a proxy to serve.
STATIC_ROOT = Path(env_str("STUDIO_STATIC_ROOT") or BASE_DIR / "staticfiles")
STATICFILES_DIRS = [BASE_DIR / "static"]
# studio/asgi.py serves /static/ itself (from the finders: no collectstatic
# needed), so one daphne process is a complete deployment. Every middleware
# is async-capable: a request never queues behind another on Django's one
# thread for sync code.

# Behind an HTTPS proxy: secure cookies and trust its X-Forwarded-Proto (and
# its X-Forwarded-For, for login throttling and the audit's client address).
STUDIO_HTTPS = env_bool("STUDIO_HTTPS", False)
if STUDIO_HTTPS:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env_int("STUDIO_HSTS_SECONDS", 0, minimum=0)

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024

# json: one JSON object per line (python-json-logger); text: for people.
# Either way each line carries request_id, user_id, conversation_id, run_id
# and approval_id where they exist (studio.logs).
STUDIO_LOG_FORMAT = env_choice("STUDIO_LOG_FORMAT", "text", ["text", "json"])
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "studio.logs.ContextFilter"}},
    "formatters": {
        "text": {
            "()": "studio.logs.TextFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s: %(message)s",
            "datefmt": "%Y-%m-%dT%H:%M:%S%z",  # ISO 8601, with the zone
        },
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "format": "%(levelname)s %(name)s %(message)s %(request_id)s "
            "%(user_id)s %(conversation_id)s %(run_id)s %(approval_id)s",
            # ISO 8601 in UTC, with the zone and microseconds.
            "timestamp": "time",
            "rename_fields": {"levelname": "level", "name": "logger"},
        },
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "filters": ["context"],
            "formatter": STUDIO_LOG_FORMAT,
        }
    },
    "root": {"handlers": ["console"], "level": env_str("STUDIO_LOG_LEVEL", "WARNING")},
}

# Studio
# A call waits this long for a person (it is only a row meanwhile): three
# days, so a call asked on a Friday afternoon still waits on Monday.
STUDIO_APPROVAL_TIMEOUT = env_float("STUDIO_APPROVAL_TIMEOUT", 3 * 24 * 3600, minimum=0.01)
STUDIO_APPROVAL_POLL_SECONDS = env_float("STUDIO_APPROVAL_POLL_SECONDS", 2, minimum=0.01)
# A chat tool's incoming webhook: one POST for each call that has waited this
# many seconds (approvals.webhook). Off when unset.
STUDIO_APPROVAL_WEBHOOK_URL = env_str("STUDIO_APPROVAL_WEBHOOK_URL")
if STUDIO_APPROVAL_WEBHOOK_URL and not STUDIO_APPROVAL_WEBHOOK_URL.startswith(
    ("http://", "https://")
):
    raise ImproperlyConfigured("STUDIO_APPROVAL_WEBHOOK_URL must be an http(s) URL")
STUDIO_APPROVAL_WEBHOOK_AFTER = env_float("STUDIO_APPROVAL_WEBHOOK_AFTER", 60, minimum=0)
STUDIO_APPROVAL_WEBHOOK_ATTEMPTS = env_int("STUDIO_APPROVAL_WEBHOOK_ATTEMPTS", 4, minimum=1)
# Seconds before the first retry; each next one waits three times longer.
STUDIO_APPROVAL_WEBHOOK_BACKOFF = env_float("STUDIO_APPROVAL_WEBHOOK_BACKOFF", 2, minimum=0)
# summary: the tool, the member and a link; full: also the arguments and the
# conversation's title (what a model wrote, escaped for chat tools).
STUDIO_APPROVAL_WEBHOOK_DETAIL = env_choice(
    "STUDIO_APPROVAL_WEBHOOK_DETAIL", "summary", ["summary", "full"]
)
# This site's address as members reach it, for links sent outside (the webhook).
STUDIO_SITE_URL = env_str("STUDIO_SITE_URL").rstrip("/")
# /readyz's details and /metrics, for monitoring that holds no session:
# "Authorization: Bearer <token>". Unset: staff only.
STUDIO_HEALTH_TOKEN = env_str("STUDIO_HEALTH_TOKEN")
STUDIO_NOTE_MAX_LENGTH = 2000
# How often each process checks whether Redis restarted (and lost its groups).
STUDIO_LAYER_WATCH_SECONDS = env_float("STUDIO_LAYER_WATCH_SECONDS", 5, minimum=0.1)
# Tools the admin lets run without a prompt for everybody (still recorded).
STUDIO_AUTO_ALLOW_TOOLS = env_list("STUDIO_AUTO_ALLOW_TOOLS", [])
# A process refreshes the heartbeat of the runs it steps this often; a run
# whose heartbeat is older than the stale limit belongs to a dead process,
# and another process resumes it.
STUDIO_RUN_HEARTBEAT_SECONDS = env_float("STUDIO_RUN_HEARTBEAT_SECONDS", 10, minimum=0.1)
STUDIO_RUN_STALE_SECONDS = env_float("STUDIO_RUN_STALE_SECONDS", 45, minimum=0.3)
# On SIGTERM, working steps get this long to finish; the rest are left for
# another process to resume.
STUDIO_SHUTDOWN_GRACE_SECONDS = env_float("STUDIO_SHUTDOWN_GRACE_SECONDS", 20, minimum=0)
# Threads for runs that are working (a run waiting for a decision holds none).
STUDIO_AGENT_WORKERS = env_int("STUDIO_AGENT_WORKERS", 64, minimum=1)
STUDIO_MAX_TOOL_ITERATIONS = env_int("STUDIO_MAX_TOOL_ITERATIONS", 25, minimum=1)
STUDIO_TOOL_TIMEOUT = env_float("STUDIO_TOOL_TIMEOUT", 300, minimum=0.1)
# Tool isolation: "bwrap" (bubblewrap, the default) or "none" (an admin's
# explicit opt-out; logged loudly at start).
STUDIO_SANDBOX = env_choice("STUDIO_SANDBOX", "bwrap", ["bwrap", "none"])
STUDIO_TOOL_MEMORY_MB = env_int("STUDIO_TOOL_MEMORY_MB", 512, minimum=16)
STUDIO_TOOL_TMP_MB = env_int("STUDIO_TOOL_TMP_MB", 64, minimum=1)
STUDIO_WORKSPACE_QUOTA_MB = env_int("STUDIO_WORKSPACE_QUOTA_MB", 256, minimum=1)
# Python calls of one conversation share one interpreter (a session) that
# keeps its variables; False: a fresh interpreter for every call.
STUDIO_PYTHON_SESSIONS = env_bool("STUDIO_PYTHON_SESSIONS", True)
# A session idle this long is ended (its memory freed); the next call starts afresh.
STUDIO_PYTHON_IDLE_SECONDS = env_float("STUDIO_PYTHON_IDLE_SECONDS", 600, minimum=1)
# At most this many sessions live in one process (each holds an interpreter's
# memory); past it, the one idle the longest ends.
STUDIO_PYTHON_MAX_SESSIONS = env_int("STUDIO_PYTHON_MAX_SESSIONS", 50, minimum=1)
# A file a member uploads into a conversation's workspace, at most (each).
STUDIO_UPLOAD_MAX_MB = env_float("STUDIO_UPLOAD_MAX_MB", 25, minimum=0.01)
# Images a tool makes are shown inline up to this size (larger: listed).
STUDIO_IMAGE_MAX_MB = env_float("STUDIO_IMAGE_MAX_MB", 5, minimum=0.01)
# A SearxNG instance for the web_search tool (absent when unset).
STUDIO_SEARXNG_URL = env_str("STUDIO_SEARXNG_URL").rstrip("/")
# MCP servers: seconds to connect to one before its tools count as unavailable.
STUDIO_MCP_CONNECT_TIMEOUT = env_float("STUDIO_MCP_CONNECT_TIMEOUT", 10, minimum=0.1)
# A cgroup v1 subtree (its name under the memory and pids controllers) that a
# privileged helper made and gave to this process's user, for per-call caps
# when the web process is not root (deploy/systemd/studio-cgroups.service).
STUDIO_TOOL_CGROUP = env_str("STUDIO_TOOL_CGROUP")
if STUDIO_TOOL_CGROUP and not re.fullmatch(
    r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*", STUDIO_TOOL_CGROUP
):
    raise ImproperlyConfigured(
        f"STUDIO_TOOL_CGROUP must be a cgroup path such as studio-tools, got {STUDIO_TOOL_CGROUP!r}"
    )
STUDIO_WORKSPACE_ROOT = Path(
    env_str("STUDIO_WORKSPACE_ROOT", str(BASE_DIR / "workspaces"))
).absolute()
# Studio's own files (the copies of the images tools make), through Django's
# default storage: pages serve these, never a workspace. Never served as
# /media/ by a proxy: the views check who may see each file.
MEDIA_ROOT = Path(env_str("STUDIO_MEDIA_ROOT", str(BASE_DIR / "media")))
if MEDIA_ROOT.resolve().is_relative_to(STUDIO_WORKSPACE_ROOT.resolve()):
    raise ImproperlyConfigured("STUDIO_MEDIA_ROOT must not be inside STUDIO_WORKSPACE_ROOT")
STUDIO_WEB_FETCH_ALLOW_PRIVATE = env_bool("STUDIO_WEB_FETCH_ALLOW_PRIVATE", False)
# Host names web_fetch may reach even when they resolve to private addresses.
STUDIO_WEB_FETCH_ALLOW_HOSTS = env_list("STUDIO_WEB_FETCH_ALLOW_HOSTS", [])
# Hosts (host or host:port) an API call's callback_url may name although they
# resolve to private addresses (an intranet service); others must be public.
STUDIO_API_CALLBACK_ALLOW_HOSTS = env_list("STUDIO_API_CALLBACK_ALLOW_HOSTS", [])

LLM_BASE_URL = env_str("LLM_BASE_URL")
LLM_MODEL = env_str("LLM_MODEL", "default")
LLM_API_KEY = env_str("LLM_API_KEY", "not-needed")
LLM_TIMEOUT = env_float("LLM_TIMEOUT", 120, minimum=0.1)
