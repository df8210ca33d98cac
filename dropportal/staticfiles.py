"""The static files' storage: whitenoise's, compressing only what changed.

whitenoise compresses every collected file at every ``collectstatic`` (gzip at its highest
level: about 2 s of CPU here), and ``manage.py serve`` runs one at each start. A file whose
compressed copies carry its own modification time (whitenoise gives them that time) was
compressed as it is; ``collectstatic`` copies a changed file anew, with a new time.

Source maps (``.map``) are not compressed either, unless ``WHITENOISE_SKIP_COMPRESS_EXTENSIONS``
says otherwise: only a browser's developer tools fetch them, and the API documentation's
bundles' maps (megabytes each) were three quarters of a first ``collectstatic``'s compressing.
A compressed copy of a file that is no longer compressed is removed: whitenoise would serve
it in the file's place, stale once the file changes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from whitenoise.compress import Compressor
from whitenoise.storage import CompressedStaticFilesStorage

NOT_COMPRESSED = (*Compressor.SKIP_COMPRESS_EXTENSIONS, "map")
# Every compressed copy whitenoise makes, brotli's whether or not it is installed now.
_COPIES = (".br", ".gz")


class CompressedOnceStaticFilesStorage(CompressedStaticFilesStorage):
    def post_process(
        self, paths: dict[str, Any], dry_run: bool = False, **options: Any
    ) -> Iterator[tuple[str, str, bool] | tuple[str, None, RuntimeError]]:
        extensions = getattr(settings, "WHITENOISE_SKIP_COMPRESS_EXTENSIONS", None)
        compressor = self.create_compressor(extensions=extensions, quiet=True)
        used = ((".br", compressor.use_brotli), (".gz", compressor.use_gzip))
        suffixes = [suffix for suffix, on in used if on]
        if not dry_run:
            self._stale_copies_removed(paths, compressor)
        changed = {
            path: found
            for path, found in paths.items()
            if not self._compressed_as_it_is(path, suffixes)
        }
        yield from super().post_process(changed, dry_run=dry_run, **options)

    def create_compressor(self, **kwargs: Any) -> Compressor:
        if kwargs.get("extensions") is None:  # the setting unset: whitenoise's list, and maps
            kwargs["extensions"] = NOT_COMPRESSED
        return super().create_compressor(**kwargs)

    def _stale_copies_removed(self, paths: dict[str, Any], compressor: Compressor) -> None:
        for path in paths:
            if compressor.should_compress(path):
                continue
            for suffix in _COPIES:
                # Unless collected itself (a package's own "x.zip.gz").
                if path + suffix not in paths:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(self.path(path + suffix))

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
