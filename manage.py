#!/usr/bin/env python
"""Django's command-line utility for dropportal."""

import os
import sys

if __name__ == "__main__":
    if sys.argv[1:3] == ["evidence", "verify"]:
        # An auditor's check: no settings, no database (integrations/evidence/verify.py).
        from integrations.evidence.verify import main

        sys.exit(main(sys.argv[3:]))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dropportal.settings")
    from dropportal import setting_up

    setting_up.pause()
    from django.core.management import ManagementUtility
    from django.core.management.base import BaseCommand

    class Utility(ManagementUtility):
        """Django's, with the collector paused until the command is looked up: after
        ``django.setup()``, before the command's system checks and its work."""

        def fetch_command(self, subcommand: str) -> BaseCommand:
            setting_up.resume()
            return super().fetch_command(subcommand)

    Utility(sys.argv).execute()
