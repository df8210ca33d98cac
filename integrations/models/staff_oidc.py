"""Staff who sign in through the company's identity provider (OpenID Connect).

A person is known by the provider's ``sub`` for its issuer: unique and never reassigned by
the provider, unlike an email address, which may pass to someone else. The account it opens
is a Django user whose roles the provider's claim sets at every sign-in
(``services/staff/staff_sign_in.py``).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class StaffOidcIdentity(models.Model):
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identity"
    )
    issuer = models.CharField(max_length=500)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_signed_in_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="staff_oidc_identity_unique")
        ]
        verbose_name = "staff identity at the identity provider"
        verbose_name_plural = "staff identities at the identity provider"

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"
