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
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
