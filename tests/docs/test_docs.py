"""The repository stands alone: no file points at documents outside it, and every
``docs/contracts.md §N`` reference names a section that page has.

Pure file checks over ``git ls-files``; no database.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ROOT / "docs" / "contracts.md"

# Names of documents that live outside the repository. Split so this file does not match.
OUTSIDE = [
    "../" + "shared",
    "product" + ".md",
    "drop-platform" + ".md",
    "broker-interface" + ".md",
    "conventions" + ".md",
]
# "docs/contracts.md §2.6", "`docs/contracts.md` §2.2", then more sections in the same
# parentheses or sentence: "§2.6, §3.2, §4.4".
REFERENCE_RE = re.compile(
    r"docs/contracts\.md`? (§[0-9]+(?:\.[0-9]+)*(?:(?:,| and| or) §[0-9.]+)*)"
)
SECTION_RE = re.compile(r"§([0-9]+(?:\.[0-9]+)*)")
HEADING_RE = re.compile(r"^#{2,4} ([0-9]+(?:\.[0-9]+)*)\.? ", re.MULTILINE)


def tracked_text_files() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "-z"],  # noqa: S607
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    files = []
    for name in names:
        path = ROOT / name.decode()
        if not name or not path.is_file():
            continue
        if b"\0" in path.read_bytes()[:8192]:  # binary (images, ZIPs)
            continue
        files.append(path)
    return files


def contract_sections() -> set[str]:
    return set(HEADING_RE.findall(CONTRACTS.read_text(encoding="utf-8")))


def test_the_patterns_find_what_they_should() -> None:
    assert REFERENCE_RE.search("see docs/contracts.md §2.6, §3.2 and §4.4")
    assert [
        SECTION_RE.findall(m)
        for m in REFERENCE_RE.findall("(`docs/contracts.md` §2.6, §3.2 and §4.4)")
    ] == [["2.6", "3.2", "4.4"]]
    assert {"1", "1.6", "2.2", "12.3"} <= contract_sections()


def test_no_tracked_file_points_outside_the_repository() -> None:
    this_file = Path(__file__).resolve()
    found = []
    for path in tracked_text_files():
        if path == this_file:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            for name in OUTSIDE:
                if name in line:
                    found.append(f"{path.relative_to(ROOT)}:{number}: {name}")
    assert not found, "documents outside the repository are named:\n" + "\n".join(found)


def test_every_contracts_reference_names_a_section_that_exists() -> None:
    sections = contract_sections()
    missing = []
    for path in tracked_text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            for group in REFERENCE_RE.findall(line):
                missing += [
                    f"{path.relative_to(ROOT)}:{number}: §{section}"
                    for section in SECTION_RE.findall(group)
                    if section not in sections
                ]
    assert not missing, "docs/contracts.md has no such section:\n" + "\n".join(missing)
