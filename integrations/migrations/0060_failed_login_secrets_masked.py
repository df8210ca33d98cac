"""Mask the passwords that failed-login records kept in clear.

A wrong old password on the own-password page counted as a failed login, and its record's
form data kept ``old_password``, ``new_password1`` and ``new_password2`` as typed (only
``password`` and ``otp_token`` were masked then). Records written since are masked as they
are written; this masks the ones written before, line by line, as the lockout does.
"""

from django.db import migrations

MASK_SQL = r"""
UPDATE axes_accessattempt
   SET post_data = regexp_replace(
         post_data,
         '^(old_password|new_password1|new_password2|csrfmiddlewaretoken)=.*$',
         '\1=********************',
         'gn')
 WHERE post_data ~ '(^|\n)(old_password|new_password1|new_password2|csrfmiddlewaretoken)='
"""


class Migration(migrations.Migration):
    dependencies = [
        ("integrations", "0059_status_fields_inlined"),
        ("axes", "0010_accessattemptexpiration"),
    ]

    operations = [migrations.RunSQL(MASK_SQL, migrations.RunSQL.noop)]
