"""Validation rules shared by the write services and the admin forms that front them.

Each returns the cleaned value or raises ``ValidationError`` keyed by the field, so a
service and a form give the same message for the same input.
"""

from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db.models import Model

from integrations.target_urls import (
    TargetUrlProblem,
    target_url_problem,
    target_url_schemes,
    url_has_credentials,
    url_has_extras,
)

NAME_MAX = 200
# C0 (tab and newline too), DEL and C1: printed to a terminal each is a command, and ESC
# starts sequences that retitle it, clear it or rewrite what it shows.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def target_url_validate(url: str, *, field: str = "url") -> str:
    """A broker-configured URL we will call, as ``target_urls`` allows it (absolute
    ``https://``; ``http://`` only when ``DROPPORTAL_ALLOW_PRIVATE_TARGETS`` is set) and
    well-formed. Its address is checked at every call."""
    url = (url or "").strip()
    allow_private = settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS
    schemes = target_url_schemes(allow_private=allow_private)
    problem = target_url_problem(url, allow_private=allow_private)
    if problem is TargetUrlProblem.PLAIN_HTTP:
        raise ValidationError({field: "plain http is refused: use an https:// URL"})
    if problem is TargetUrlProblem.UNREADABLE:
        # URLValidator takes any port of up to five digits.
        raise ValidationError(
            {field: "not a readable URL: a port is a number up to 65535, an IPv6 host in [ ]"}
        )
    try:
        URLValidator(schemes=list(schemes))(url)
    except ValidationError:
        raise ValidationError({field: f"not an absolute {' or '.join(schemes)} URL"}) from None
    if len(url) > 500:
        raise ValidationError({field: "at most 500 characters"})
    return url_credentials_validate(url, field=field)


def base_url_validate(url: str, *, field: str) -> str:
    """A target URL (``target_url_validate``) the API's paths are appended to, so one that
    ends at its path: a query, fragment or ``;`` parameters would hold the paths, and every
    call would go to the base URL itself."""
    url = target_url_validate(url, field=field)
    if url_has_extras(url):
        raise ValidationError(
            {field: "a base URL must end at its path: no query (?), fragment (#) or ; parameters"}
        )
    return url


def url_credentials_validate(url: str, *, field: str) -> str:
    """``url`` unless it carries a user name or password (which would go along as Basic
    auth, and be shown and logged wherever the URL is)."""
    if url_has_credentials(url):
        raise ValidationError(
            {field: "a URL must not carry a user name or password: set credentials apart"}
        )
    return url


def name_characters_validate(name: str, *, field: str = "name") -> str:
    """``name`` (of a broker, an integration, an API key, ...) unless it holds a control
    character: names are printed on staff's terminals, which would obey them. The one home
    of that rule; each service checks its names' length its own way."""
    if has_control_characters(name):
        raise ValidationError(
            {field: "a name must not hold control characters (a tab, a newline, ESC, ...)"}
        )
    return name


def integration_name_validate(name: str) -> str:
    """The name staff give an integration or ISI connection: not blank, at most 200, no
    control character."""
    name = (name or "").strip()
    if not name:
        raise ValidationError({"name": "a name is required"})
    if len(name) > NAME_MAX:
        raise ValidationError({"name": f"at most {NAME_MAX} characters"})
    return name_characters_validate(name)


def column_fits(value: str, model: type[Model], field: str, *, key: str = "") -> str:
    """``value`` unless it is longer than ``model``'s ``field`` column holds (its
    ``max_length``, read from the model, the width's one home): refused here, keyed ``key``
    (default: the field), rather than by the database with a ``DataError``."""
    limit = getattr(model._meta.get_field(field), "max_length", None)
    if limit is not None and len(value) > limit:
        raise ValidationError({key or field: f"at most {limit} characters, not {len(value)}"})
    return value


def disabled_reason_validate(reason: str, model: type[Model]) -> str:
    """The reason staff give for pausing a target (an integration, a SaaS connection):
    refused past its column rather than cut, as a reason kept in part says something else;
    none given, "disabled by staff"."""
    reason = (reason or "").strip()
    return column_fits(reason, model, "disabled_reason", key="reason") or "disabled by staff"


def has_control_characters(text: str) -> bool:
    """Whether ``text`` holds a control character (C0, DEL or C1)."""
    return _CONTROL.search(text) is not None


def first_control_character(text: str) -> str | None:
    """The first control character (C0, DEL or C1) of ``text``, or None."""
    found = _CONTROL.search(text)
    return found.group() if found else None


def bearer_token_sendable(value: str) -> bool:
    """Whether ``value`` can follow ``Bearer `` in a header: visible ASCII with no space at
    its ends (RFC 6749 appendix A.12; RFC 6750's b64token is a subset of it)."""
    return bool(value) and value == value.strip(" ") and all(" " <= c <= "~" for c in value)


def bearer_token_validate(token: str, *, field: str = "token") -> str:
    """A static bearer token staff enter: one a header can carry. A pasted "’" or "…" passed
    before and failed every call to the target (the value is never echoed: a credential)."""
    if token and not bearer_token_sendable(token):
        raise ValidationError({field: "a bearer token holds printable ASCII characters only"})
    return token
