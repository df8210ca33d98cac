# A work item's reported_status_code, reported_at and report_file now say what DROP holds:
# they are set when DROP accepts a file with the item (or staff mark it uploaded by hand),
# no longer when the file is written. The file an item was written into and DROP has not
# taken is pending_report_file (prior_report_file renamed), with the status written into it,
# pending_status_code (prior_reported_status_code renamed); prior_reported_at, which kept
# what DROP held under an amendment, is gone: that stays in reported_*. Rows of files DROP
# has not answered yet are brought to that meaning: an upload's rows hold nothing yet; an
# amendment's rows hold what they held before it. Their state and amendment flag follow as
# when settling.

from django.db import migrations

_FORWARD = """
UPDATE integrations_workitem
SET prior_report_file_id = NULL, prior_reported_status_code = NULL, prior_reported_at = NULL
WHERE (prior_report_file_id IS NOT NULL OR prior_reported_at IS NOT NULL)
  AND (report_file_id IS NULL OR report_file_id NOT IN (
      SELECT id FROM integrations_reportfile WHERE state IN ('written', 'refused')));

UPDATE integrations_workitem w
SET prior_report_file_id = w.report_file_id, prior_reported_status_code = w.reported_status_code,
    report_file_id = CASE WHEN r.kind = 'amend' THEN w.prior_report_file_id END,
    reported_status_code = CASE WHEN r.kind = 'amend' THEN w.prior_reported_status_code END,
    reported_at = CASE WHEN r.kind = 'amend' THEN coalesce(w.prior_reported_at, w.reported_at)
                  END,
    (state, needs_amendment) = (
        SELECT CASE WHEN w.state = 'removed' THEN w.state ELSE f.state END,
               CASE WHEN w.state = 'removed' THEN false ELSE f.needs_amendment END
        FROM dropportal_work_item_status_fields(
            p_code => w.status_code,
            p_reported_at => CASE WHEN r.kind = 'amend'
                                  THEN coalesce(w.prior_reported_at, w.reported_at) END,
            p_reported_code => CASE WHEN r.kind = 'amend'
                                    THEN w.prior_reported_status_code END,
            p_needs_amendment => w.needs_amendment) f
    )
FROM integrations_reportfile r
WHERE r.id = w.report_file_id AND r.state IN ('written', 'refused');
"""


class Migration(migrations.Migration):
    dependencies = [
        ("integrations", "0028_drop_notification_signature"),
    ]

    operations = [
        # One way: which rows a written file had marked cannot be told back from the rows.
        migrations.RunSQL(_FORWARD, reverse_sql=migrations.RunSQL.noop),
        migrations.RenameField(
            model_name="workitem", old_name="prior_report_file", new_name="pending_report_file"
        ),
        migrations.RenameField(
            model_name="workitem",
            old_name="prior_reported_status_code",
            new_name="pending_status_code",
        ),
        migrations.RemoveField(model_name="workitem", name="prior_reported_at"),
    ]
