"""The evidence key: the Ed25519 key that signs evidence packs and directives::

    key = evidence_signing_key()   # DROPPORTAL_EVIDENCE_KEY, or one generated into var/
                                   # (EvidenceKeyRefused when it cannot be loaded)

Apart from ``pack`` (which the offline verifier reads with no Django), since it reads the
deployment's settings.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils.module_loading import import_string

from integrations.evidence import pack


class EvidenceKeyRefused(ValidationError):
    """The evidence key cannot be loaded, so nothing can be signed. A set key is checked at
    start (dropportal/settings.py), but the generated one in ``var/`` is read at first use
    and may have been made unreadable or damaged since."""


def evidence_signing_key() -> Ed25519PrivateKey:
    """``DROPPORTAL_EVIDENCE_KEY``, or the one ``DROPPORTAL_EVIDENCE_KEY_GENERATOR`` makes
    (into ``var/``) on first use; ``EvidenceKeyRefused`` when it cannot be loaded."""
    try:
        pem = (
            settings.DROPPORTAL_EVIDENCE_KEY
            or import_string(settings.DROPPORTAL_EVIDENCE_KEY_GENERATOR)()
        )
        return pack.load_private_key(pem)
    except (OSError, ValueError) as exc:
        raise EvidenceKeyRefused(f"DROPPORTAL_EVIDENCE_KEY: {exc}") from None
