"""Sending an alert to staff: by email (Django's mail, ``EMAIL_URL``) to
``DROPPORTAL_ALERT_EMAILS``, or as JSON ``{"text": ..., "alert": {...}}`` POSTed to
``DROPPORTAL_ALERT_WEBHOOK_URL`` (Slack and Teams incoming webhooks accept it). No database
writes; an error raises, so the job sending it retries::

    alert_send(channel="webhook", text="[dropportal] ALERT: ...", alert={...})
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.mail import send_mail

from integrations.outbound_http import deliver

WEBHOOK_TIMEOUT_SECONDS = 10
CHANNELS = ("email", "webhook")


class AlertNotSent(Exception):
    """The alert webhook did not take the alert; the job sending it retries."""


class AlertRefused(AlertNotSent):
    """The alert webhook refused the alert for good (a 4xx but 408 and 429: its URL, or what
    it accepts, is wrong): sent again it is refused again, and the messages of the same
    alert wait behind it, so its job is not retried (it fails, for staff to see)."""


# 4xx answers that say "later", not "never".
_TRY_LATER = (408, 429)


def alert_send(*, channel: str, text: str, alert: dict[str, Any]) -> None:
    if channel == "email":
        _email(text, alert)
    elif channel == "webhook":
        _webhook(text, alert)
    else:
        raise ValueError(f"unknown alert channel {channel!r}; known: {', '.join(CHANNELS)}")


def _email(text: str, alert: dict[str, Any]) -> None:
    recipients = settings.DROPPORTAL_ALERT_EMAILS
    if not recipients:
        return  # the setting was removed since the alert was queued
    subject = " ".join(text.split())[:200]
    body = f"{text}\n\n{json.dumps(alert, indent=2, sort_keys=True, ensure_ascii=False)}\n"
    send_mail(subject, body, None, recipients, fail_silently=False)


def _webhook(text: str, alert: dict[str, Any]) -> None:
    url = settings.DROPPORTAL_ALERT_WEBHOOK_URL
    if not url:
        return
    # Filtered like every other call: the alert carries broker ids and texts, so it goes
    # only to a public https endpoint (DROPPORTAL_ALLOW_PRIVATE_TARGETS opens it, as for all).
    result = deliver(
        "POST",
        url,
        body=json.dumps({"text": text, "alert": alert}, allow_nan=False).encode(),
        headers={"Content-Type": "application/json"},
        allow_private=settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS,
        timeout_total=WEBHOOK_TIMEOUT_SECONDS,
    )
    if result.error is None and result.status is not None and 200 <= result.status < 300:
        return
    problem = f"alert webhook: {result.error or f'HTTP {result.status}'}"
    status = result.status
    if status is not None and 400 <= status < 500 and status not in _TRY_LATER:
        raise AlertRefused(problem)
    raise AlertNotSent(problem)
