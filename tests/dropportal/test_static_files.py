"""``collectstatic`` compresses a static file once, and again once it has changed (a source
map never): each ``manage.py serve`` runs one, and compressing every file every time was most
of it."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from django.core.files.base import ContentFile

from dropportal.staticfiles import CompressedOnceStaticFilesStorage

STYLE = b"body { color: #333; margin: 0 auto; }\n" * 40


def test_a_file_is_compressed_again_only_once_it_has_changed(tmp_path: Path) -> None:
    storage = CompressedOnceStaticFilesStorage(location=tmp_path, base_url="/static/")
    for name in ("site.css", "site.js", "logo.png"):
        storage.save(name, ContentFile(STYLE))
    collected = dict.fromkeys(["site.css", "site.js", "logo.png"])

    def compressed() -> list[str]:
        return sorted(str(name) for _, name, done in storage.post_process(collected) if done)

    assert compressed() == ["site.css.gz", "site.js.gz"]  # an image is never compressed
    assert compressed() == []

    # As collectstatic copies a changed file: anew, so with a later time.
    changed = STYLE.replace(b"#333", b"#000")
    before = os.stat(tmp_path / "site.css").st_mtime
    storage.delete("site.css")
    storage.save("site.css", ContentFile(changed))
    os.utime(tmp_path / "site.css", (before + 1, before + 1))
    assert compressed() == ["site.css.gz"]
    assert gzip.decompress((tmp_path / "site.css.gz").read_bytes()) == changed

    (tmp_path / "site.js.gz").unlink()  # a compressed copy gone: made again
    assert compressed() == ["site.js.gz"]
    assert compressed() == []


def test_a_source_map_is_served_as_it_is_and_its_earlier_copy_removed(tmp_path: Path) -> None:
    storage = CompressedOnceStaticFilesStorage(location=tmp_path, base_url="/static/")
    for name in ("site.js.map", "data.zip", "data.zip.gz"):
        storage.save(name, ContentFile(STYLE))
    # As an earlier version compressed it: whitenoise would serve it in the map's place.
    (tmp_path / "site.js.map.gz").write_bytes(gzip.compress(b"an earlier map"))
    collected = dict.fromkeys(["site.js.map", "data.zip", "data.zip.gz"])

    assert [name for _, name, done in storage.post_process(collected) if done] == []
    assert not (tmp_path / "site.js.map.gz").exists()
    assert (tmp_path / "data.zip.gz").read_bytes() == STYLE  # collected itself: kept
