"""Verify an evidence pack offline: no database, no Django, only ``cryptography`` (and
``rfc3161-client`` for the time-stamp tokens).

An auditor runs it from a plain checkout (or through ``manage.py evidence verify``)::

    python -m integrations.evidence.verify PACK.zip --public-key dropportal-evidence.pem
    python -m integrations.evidence.verify PACK.zip --json
    python -m integrations.evidence.verify PACK.zip --public-key KEY.pem --tsa-cert TSA-CA.pem

It checks, in order, and stops at the first thing that does not hold (exit 1, naming it):
the archive's every byte (fixed member metadata, no byte outside a member, the manifest or
the directory), the manifest's Ed25519 signature, every file's SHA-256 and row count, every
ledger event's hash and the chain over the range, the RFC 3161 time-stamp tokens over it
(each one's message imprint is the chain hash recomputed at its position, and what
``anchors.json`` says of it, its event id, file name, SHA-256 and time, is the ledger's and
the token's; with ``--tsa-cert FILE``, its signature chains to that certificate, and a
range of chained events without any token fails; else they are present but not checked
against an authority), that every outcome row and every status
in the DROP files has its ledger events, and that ``components.json`` holds together (a pack
without it, from before the audit's components, fails unless ``--allow-pre-components`` is
given; then it verifies and says so), and that the sample is the one its seed draws from
the population the pack carries (a sample without it fails unless
``--allow-pre-population`` is given). Exit 0 when all hold.
A component that failed its tests at export does not make the pack fail: the pack is
authentic, and it records that the system failed that test; each component's result is
printed (``--json``: ``components`` and ``components_failed``). Without ``--public-key`` the
signature is checked against the key the pack carries, which proves the pack whole but not
who signed it: stderr says so, and ``--json`` has ``"signer_checked": false``.
"""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from integrations.evidence.archive import PackInvalid
from integrations.evidence.checks import PackChecker, Verification
from integrations.evidence.timestamps import load_certificates

if TYPE_CHECKING:
    from cryptography import x509

__all__ = ["PackInvalid", "Verification", "main", "run", "verify_pack"]


def verify_pack(
    path: str | Path,
    *,
    public_key_pem: bytes | None = None,
    tsa_certificates: list[x509.Certificate] | None = None,
    allow_pre_components: bool = False,
    allow_pre_population: bool = False,
) -> Verification:
    """Check the pack at ``path``; the result names the first failure, if any."""
    result = Verification(ok=False)
    try:
        with open(path, "rb") as raw:
            try:
                archive = zipfile.ZipFile(raw)
            except (zipfile.BadZipFile, OSError, ValueError) as exc:
                raise PackInvalid(f"not a readable ZIP archive: {exc}") from None
            with archive:
                PackChecker(
                    raw,
                    archive,
                    public_key_pem,
                    result,
                    tsa_certificates,
                    allow_pre_components=allow_pre_components,
                    allow_pre_population=allow_pre_population,
                ).run()
    except PackInvalid as exc:
        result.failure = str(exc)
        return result
    except OSError as exc:
        result.failure = f"cannot read {path}: {exc.strerror or exc}"
        return result
    except RecursionError:
        # What the pack nests is read by recursion in more places than its parsing.
        result.failure = "a value in the pack is nested too deeply to check"
        return result
    result.ok = True
    return result


class _OneLineErrors(argparse.ArgumentParser):
    """A bad argument is one line and exit 2, as ``manage.py``'s other commands say it (they
    need Django for theirs; this check runs without it), not argparse's usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    parser = _OneLineErrors(
        prog="evidence verify", description="Check a dropportal evidence pack offline."
    )
    parser.add_argument("pack", help="the evidence pack (ZIP)")
    parser.add_argument("--public-key", help="the PEM public key the pack must be signed with")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_tsa_cert_argument(parser)
    add_allow_older_pack_arguments(parser)
    args = parser.parse_args(argv)
    return run(
        args.pack,
        public_key=args.public_key,
        as_json=args.json,
        tsa_cert=args.tsa_cert,
        allow_pre_components=args.allow_pre_components,
        allow_pre_population=args.allow_pre_population,
    )


def add_tsa_cert_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tsa-cert",
        metavar="FILE",
        help="the time-stamping authority's CA certificate (PEM): every token's signature "
        "must chain to it, a pack whose ledger range holds chained events must carry "
        "tokens, and its last token may precede the last event it shows by two days at most "
        "(the service anchors daily)",
    )


def add_allow_older_pack_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-pre-components",
        action="store_true",
        help="accept a pack without components.json, as exported before packs were laid out "
        "by the audit's components (without it such a pack fails: anyone holding the "
        "signing key could delete the components and sign again)",
    )
    parser.add_argument(
        "--allow-pre-population",
        action="store_true",
        help="accept a sample without sample_population.csv, the work items it was drawn "
        "from, as exported before packs carried it: its draw is then not checked again "
        "(without it such a pack fails)",
    )


def run(
    pack_path: str,
    *,
    public_key: str | None,
    as_json: bool,
    tsa_cert: str | None = None,
    allow_pre_components: bool = False,
    allow_pre_population: bool = False,
) -> int:
    """Verify, print the outcome (stdout; the failure on stderr too) and return the exit code."""
    key_pem = None
    if public_key:
        try:
            key_pem = Path(public_key).read_bytes()
        except OSError as exc:
            sys.stderr.write(f"cannot read {public_key}: {exc.strerror}\n")
            return 1
    authorities = None
    if tsa_cert:
        try:
            authorities = load_certificates(Path(tsa_cert).read_bytes())
        except OSError as exc:
            sys.stderr.write(f"cannot read {tsa_cert}: {exc.strerror}\n")
            return 1
        except ValueError as exc:
            sys.stderr.write(f"{tsa_cert}: {exc}\n")
            return 1
    result = verify_pack(
        pack_path,
        public_key_pem=key_pem,
        tsa_certificates=authorities,
        allow_pre_components=allow_pre_components,
        allow_pre_population=allow_pre_population,
    )
    if key_pem is None and result.key_fingerprint:
        # Anyone can re-sign an edited pack with a key of their own and enclose it.
        sys.stderr.write(
            "note: integrity checked against the public key the pack carries (SHA-256 "
            f"{result.key_fingerprint[:16]}…), not who signed it; pass --public-key FILE "
            "(from `evidence public-key`) to check the signer\n"
        )
    if as_json:
        sys.stdout.write(json.dumps(result.as_json(), indent=2) + "\n")
    else:
        for line in result.checks:
            # A component's own line says its result; every other line is a check that held.
            failed_line = line.startswith("component ") and ": FAIL" in line
            sys.stdout.write(f"{'--' if failed_line else 'ok'}  {line}\n")
    if not result.ok:
        sys.stderr.write(f"Evidence pack does not verify: {result.failure}\n")
        return 1
    failed = result.components_failed
    if failed:
        # Authentic, and what it records is a failure: said on stderr too, for automation.
        sys.stderr.write(
            f"note: the pack verifies, and {len(failed)} component(s) failed their tests at "
            f"export: {', '.join(failed)}\n"
        )
    if not as_json:
        sys.stdout.write("Evidence pack verified.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
