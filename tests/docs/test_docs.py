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


# A path in backticks in the architecture page: `services/dispatch/deliveries.py`, `sql/x.sql`,
# `tests/sql/test_sql_rules.py`, optionally with `::test_name`.
ARCHITECTURE = ROOT / "docs" / "architecture.md"
CODE_PATH_RE = re.compile(r"`((?:[\w.-]+/)*[\w.-]+\.(?:py|sql|json|html|css|js))(?:::(\w+))?`")


def test_every_file_the_architecture_page_names_exists() -> None:
    """The recipes of docs/architecture.md name real files (and real tests): a move or a
    rename that leaves the page behind fails here. Paths are the app's (integrations/...) or
    the repository's."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    named = CODE_PATH_RE.findall(text)
    assert len(named) > 50  # the pattern still finds the page's paths
    missing = []
    for path, test_name in named:
        if "<" in path or "NNNN" in path or path.startswith("0013_"):
            continue  # a placeholder (`dispatch/<kind>.py`) or a migration by number
        found = [base / path for base in (ROOT / "integrations", ROOT) if (base / path).is_file()]
        if not found:
            missing.append(path)
        elif test_name and f"def {test_name}(" not in found[0].read_text(encoding="utf-8"):
            missing.append(f"{path}::{test_name}")
    assert missing == []
