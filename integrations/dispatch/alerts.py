"""Sending an alert to staff: by email (Django's mail, ``EMAIL_URL``) to
``DROPPORTAL_ALERT_EMAILS``, or as JSON ``{"text": ..., "alert": {...}}`` POSTed to
``DROPPORTAL_ALERT_WEBHOOK_URL`` (Slack and Teams incoming webhooks accept it). No database
writes; an error raises, so the job sending it retries::

    alert_send(channel="webhook", text="[dropportal] ALERT: ...", alert={...})
"""

from __future__ import annotations

import json
from typing import Any

import requests
from django.conf import settings
from django.core.mail import send_mail

WEBHOOK_TIMEOUT_SECONDS = 10
CHANNELS = ("email", "webhook")


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
    # The operator's own endpoint, set in the environment, not a broker's target: a plain
    # session (the SSRF-safe one refuses the internal chat gateways this often is).
    response = requests.post(
        url, json={"text": text, "alert": alert}, timeout=WEBHOOK_TIMEOUT_SECONDS
    )
    response.raise_for_status()
