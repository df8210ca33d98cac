"""An index on a deletion request's broker and id, for the outcome history's pages.

``GET /api/v1/drop/outcomes`` reads one broker's requests in id order, a page at a time.
Through the primary key alone PostgreSQL walked the ids and threw away every other broker's
requests on the way: a page that crossed into the broker's next cycle, or its last page,
read every request of the other brokers in between. The page orders by broker and id, its
broker a range of one value (``selectors/outcomes.py``), so PostgreSQL takes this index even
when it reckons the broker's rows spread evenly among the others'.

Built concurrently: ``migrate`` runs while the old release still serves, and a plain build
holds off every write to deletion requests (callbacks, deliveries) for its duration, about
a minute at fifty million rows.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("integrations", "0064_admin_sessions_by_user"),
    ]

    operations = [
        # An interrupted concurrent build leaves an invalid index of the name: built again.
        migrations.RunSQL(
            "DROP INDEX CONCURRENTLY IF EXISTS deletion_request_broker_pages",
            migrations.RunSQL.noop,
        ),
        AddIndexConcurrently(
            model_name="deletionrequest",
            index=models.Index(
                fields=["broker_id_code", "id"], name="deletion_request_broker_pages"
            ),
        ),
    ]
