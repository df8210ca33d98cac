"""The evidence key: the Ed25519 key that signs evidence packs and directives::

    key = evidence_signing_key()   # DROPPORTAL_EVIDENCE_KEY, or one generated into var/

Apart from ``pack`` (which the offline verifier reads with no Django), since it reads the
deployment's settings.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils.module_loading import import_string

from integrations.evidence import pack


def evidence_signing_key() -> Ed25519PrivateKey:
    """``DROPPORTAL_EVIDENCE_KEY``, or the one ``DROPPORTAL_EVIDENCE_KEY_GENERATOR`` makes
    (into ``var/``) on first use."""
    pem = (
        settings.DROPPORTAL_EVIDENCE_KEY
        or import_string(settings.DROPPORTAL_EVIDENCE_KEY_GENERATOR)()
    )
    try:
        return pack.load_private_key(pem)
    except ValueError as exc:
        raise ValidationError(f"DROPPORTAL_EVIDENCE_KEY: {exc}") from None
