"""Validation rules shared by the write services and the admin forms that front them.

Each returns the cleaned value or raises ``ValidationError`` keyed by the field, so a
service and a form give the same message for the same input.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator

NAME_MAX = 200


def url_has_credentials(url: str) -> bool:
    """Whether ``url`` carries a ``user:password@`` part (which HTTP clients send as Basic
    auth, and which would be shown and logged wherever the URL is)."""
    try:
        return "@" in urlsplit(url).netloc
    except ValueError:
        return False


def target_url_validate(url: str, *, field: str = "url") -> str:
    """A broker-configured URL we will call: absolute ``https://`` (``http://`` only when
    ``DROPPORTAL_ALLOW_PRIVATE_TARGETS`` is set). Its address is checked at every call."""
    url = (url or "").strip()
    schemes = ["https", "http"] if settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS else ["https"]
    try:
        URLValidator(schemes=schemes)(url)
    except ValidationError:
        if urlsplit(url).scheme == "http":
            raise ValidationError({field: "plain http is refused: use an https:// URL"}) from None
        raise ValidationError({field: f"not an absolute {' or '.join(schemes)} URL"}) from None
    if len(url) > 500:
        raise ValidationError({field: "at most 500 characters"})
    if url_has_credentials(url):
        raise ValidationError(
            {field: "a URL must not carry a user name or password: set credentials apart"}
        )
    return url


def integration_name_validate(name: str) -> str:
    """The name staff give an integration or ISI connection: not blank, at most 200."""
    name = (name or "").strip()
    if not name:
        raise ValidationError({"name": "a name is required"})
    if len(name) > NAME_MAX:
        raise ValidationError({"name": f"at most {NAME_MAX} characters"})
    return name
