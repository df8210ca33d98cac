"""``make bench``: run every ``bench/bench_*.py`` in turn and summarize their results.

Each bench is a standalone script that prints one JSON object as its last line of output,
with at least ``name``, ``target_met`` (bool) and its figures. Record the figures, with the
machine they ran on, in docs/benchmarks.md. A bench makes its own scratch database before
Django starts, so it imports the app inside functions, after ``django.setup()``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent


def machine() -> str:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, {cpu}".strip(", ")


def main() -> int:
    only = set(sys.argv[1:])
    print(f"machine: {machine()}, Python {platform.python_version()}", flush=True)
    failures = 0
    for script in sorted(BENCH_DIR.glob("bench_*.py")):
        if only and script.stem not in only and script.stem.removeprefix("bench_") not in only:
            continue
        print(f"\n== {script.stem}", flush=True)
        proc = subprocess.run(  # noqa: S603
            [sys.executable, str(script)], capture_output=True, text=True, check=False
        )
        sys.stderr.write(proc.stderr[-2000:])
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        try:
            result = json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            print(f"{script.stem}: no result (exit {proc.returncode})\n{proc.stdout[-2000:]}")
            failures += 1
            continue
        print(json.dumps(result, indent=2))
        if not result.get("target_met", False):
            failures += 1
    print(f"\n{failures} bench(es) missed a target or failed" if failures else "\nall targets met")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
