# The data rows of a DROP list set aside unread (a type this version does not know, a header
# that is not ID,Hash) are counted at import and kept on the cycle: DROP sent each as a
# request, so the yearly figures count them as received. Earlier cycles hold none (their
# counts are unknown).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("integrations", "0030_callbacks_correlated_by_their_keys")]

    operations = [
        migrations.AddField(
            model_name="dropcycle",
            name="unread_rows",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
