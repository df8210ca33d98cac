"""The static files' storage: whitenoise's, compressing only what changed.

whitenoise compresses every collected file at every ``collectstatic`` (gzip at its highest
level: about 2 s of CPU here), and ``manage.py serve`` runs one at each start. A file whose
compressed copies carry its own modification time (whitenoise gives them that time) was
compressed as it is; ``collectstatic`` copies a changed file anew, with a new time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from whitenoise.storage import CompressedStaticFilesStorage


class CompressedOnceStaticFilesStorage(CompressedStaticFilesStorage):
    def post_process(
        self, paths: dict[str, Any], dry_run: bool = False, **options: Any
    ) -> Iterator[tuple[str, str, bool] | tuple[str, None, RuntimeError]]:
        extensions = getattr(settings, "WHITENOISE_SKIP_COMPRESS_EXTENSIONS", None)
        compressor = self.create_compressor(extensions=extensions, quiet=True)
        used = ((".br", compressor.use_brotli), (".gz", compressor.use_gzip))
        suffixes = [suffix for suffix, on in used if on]
        changed = {
            path: found
            for path, found in paths.items()
            if not self._compressed_as_it_is(path, suffixes)
        }
        yield from super().post_process(changed, dry_run=dry_run, **options)

    def _compressed_as_it_is(self, path: str, suffixes: list[str]) -> bool:
        full = self.path(path)
        try:
            mtime = os.stat(full).st_mtime
            # whitenoise sets the copies' time from the float: equal to well under a µs.
            return bool(suffixes) and all(
                abs(os.stat(full + suffix).st_mtime - mtime) < 1e-6 for suffix in suffixes
            )
        except FileNotFoundError:
            return False
