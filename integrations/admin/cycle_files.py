"""A cycle's response files as one ZIP, for auditors: every file written for it (uploads and
amendments, whether DROP took them or not) exactly as stored, and a ``MANIFEST.csv`` with
each file's kind, rows, SHA-256, state (which says whether DROP was sent it), upload time
and DROP's answer, so the bytes can be checked against the ledger::

    POST /admin/integrations/dropcycle/<pk>/response-files.zip

Linked from the cycle's page; needs the permission to view report files. The download is a
``report_files.exported`` ledger event.
"""

from __future__ import annotations

import csv
import io
import json
import tempfile
import zipfile

from django.core.exceptions import PermissionDenied
from django.http import FileResponse, HttpRequest
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_POST

from integrations.admin.actors import staff_actor
from integrations.models import DropCycle, ReportFile
from integrations.services.evidence.audit import report_files_export_record

MANIFEST_COLUMNS = (
    "file_name",
    "kind",
    "rows",
    "sha256",
    "state",
    "created_at",
    "uploaded_at",
    "drop_response",
)
IN_MEMORY = 16 * 1024 * 1024  # larger archives spill to a temporary file


@require_POST  # it writes a ledger event: no link or prefetch may trigger it
def cycle_response_files_view(request: HttpRequest, pk: int) -> FileResponse:
    if not request.user.has_perm("integrations.view_reportfile"):
        raise PermissionDenied
    cycle = get_object_or_404(DropCycle.objects.select_related("broker"), pk=pk)
    files = ReportFile.objects.filter(cycle=cycle).order_by("created_at", "pk")
    manifest = io.StringIO()
    writer = csv.writer(manifest)
    writer.writerow(MANIFEST_COLUMNS)
    archive_file = tempfile.SpooledTemporaryFile(max_size=IN_MEMORY)  # noqa: SIM115  (FileResponse closes it)
    count = 0
    with zipfile.ZipFile(archive_file, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for report_file in files.iterator(chunk_size=20):
            archive.writestr(report_file.file_name, bytes(report_file.content))
            writer.writerow(
                [
                    report_file.file_name,
                    report_file.kind,
                    report_file.rows,
                    report_file.sha256,
                    report_file.state,
                    report_file.created_at.isoformat(),
                    report_file.uploaded_at.isoformat() if report_file.uploaded_at else "",
                    json.dumps(report_file.drop_response, sort_keys=True),
                ]
            )
            count += 1
        archive.writestr("MANIFEST.csv", manifest.getvalue())
    report_files_export_record(
        actor=staff_actor(request),
        broker_id=cycle.broker.broker_id,
        cycle=cycle.drop_session_id,
        files=count,
    )
    archive_file.seek(0)
    name = f"{cycle.broker.broker_id}_cycle{cycle.drop_session_id}_response_files.zip"
    return FileResponse(
        archive_file, as_attachment=True, filename=name, content_type="application/zip"
    )
