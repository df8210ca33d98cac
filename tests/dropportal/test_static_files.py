"""``collectstatic`` compresses a static file once, and again once it has changed: each
``manage.py serve`` runs one, and compressing every file every time was most of it."""

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
