"""``manage.py secrets reencrypt``: rewrite every stored secret under the newest key.

Put a new key first in ``DROPPORTAL_ENCRYPTION_KEYS``, run this, then drop the old key.
"""

from __future__ import annotations

from typing import Any

from integrations.management.base import DropportalCommand
from integrations.services.staff.secrets import secrets_reencrypt


class Command(DropportalCommand):
    help = "Manage secrets at rest."

    def add_subcommands(self, subparsers: Any) -> None:
        subparsers.add_parser("reencrypt", help="re-encrypt stored secrets with the newest key")

    def handle_reencrypt(self, **options: Any) -> None:
        total = secrets_reencrypt(actor=self.actor())
        self.stdout.write(f"Re-encrypted {total} stored secrets with the newest key.")
