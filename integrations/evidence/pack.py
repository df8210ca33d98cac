"""The evidence pack's format and signature, shared by its writer and its verifier.

No Django and no database here: the verifier runs from a plain checkout with only
``cryptography`` installed. A pack is a ZIP whose members are written with fixed metadata
(``member_info``), so that the verifier can hold every byte of the archive to account::

    manifest.json   what the pack holds: each file's SHA-256 and row count, the ledger range
    manifest.sig    Ed25519 signature (Base64) over the exact bytes of manifest.json
    outcomes.csv    the outcome history of the period
    ledger.jsonl    the ledger range, one chain link per line
    drop/<cycle>/<file>              a response file exactly as sent to DROP
    drop/<cycle>/<file>.answer.json  what DROP answered to it
    summary.html    one page for a person
    components.json, components/...  the audit's components (``components``)
    sample/<id>.html, sample_population.csv   with a sample: its pages, what it is drawn from

    signature = sign_manifest(private_key_pem, manifest_bytes)
    verify_manifest(public_key_pem, manifest_bytes, signature)  # raises InvalidSignature
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import math
import zipfile
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

FORMAT = "dropportal-evidence-pack/1"
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
OUTCOMES = "outcomes.csv"
LEDGER = "ledger.jsonl"
SUMMARY = "summary.html"
DROP_DIR = "drop/"
ANSWER_SUFFIX = ".answer.json"

# Every member is written with this metadata and nothing else, so none of the archive's
# bytes is left unchecked.
FIXED_DATE_TIME = (1980, 1, 1, 0, 0, 0)
MEMBER_MODE = 0o644 << 16
CREATE_SYSTEM = 3  # Unix
COMPRESSION = zipfile.ZIP_DEFLATED


def member_info(name: str) -> zipfile.ZipInfo:
    """How every member is written (``force_zip64=True``); the manifest and its signature are
    stored as they are, the rest deflated (the manifest holds their stored bytes' digests)."""
    info = zipfile.ZipInfo(name, date_time=FIXED_DATE_TIME)
    info.compress_type = zipfile.ZIP_STORED if name in (MANIFEST, SIGNATURE) else COMPRESSION
    info.external_attr = MEMBER_MODE
    info.create_system = CREATE_SYSTEM
    return info


def load_private_key(pem: str) -> Ed25519PrivateKey:
    """An Ed25519 private key from PEM; ``ValueError`` for anything else."""
    try:
        key = serialization.load_pem_private_key(pem.encode(), password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not a PEM private key without a password: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError("the evidence key must be an Ed25519 private key")
    return key


def load_public_key(pem: str | bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM; ``ValueError`` for anything else."""
    data = pem.encode() if isinstance(pem, str) else pem
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not a PEM public key: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError("not an Ed25519 public key")
    return key


def public_key_pem(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


def key_fingerprint(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """SHA-256 of the raw public key, hex: what the manifest and the verifier name."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def sign_manifest(key: Ed25519PrivateKey, manifest: bytes) -> bytes:
    """The content of ``manifest.sig``: the signature in Base64, one line."""
    return sign_manifest_text(key.sign(manifest))


def sign_manifest_text(signature: bytes) -> bytes:
    return base64.b64encode(signature) + b"\n"


def verify_manifest(key: Ed25519PublicKey, manifest: bytes, signature_file: bytes) -> None:
    """Raise ``InvalidSignature`` (or ``ValueError``) unless the signature holds."""
    signature = base64.b64decode(signature_file, validate=False)
    # Only the exact form the writer makes: Base64 leaves bits a decoder ignores.
    if sign_manifest_text(signature) != signature_file:
        raise ValueError("manifest.sig is not one line of canonical Base64")
    key.verify(signature, manifest)


def json_read(text: str | bytes) -> Any:
    """A pack's JSON as the verifier reads it; ``ValueError`` for what no pack's writer makes
    and the checks after would crash on: NaN, Infinity, a number beyond a float (``1e999``)
    and nesting deeper than Python's stack."""
    try:
        return json.loads(text, parse_constant=_constant_refused, parse_float=_finite_float)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _constant_refused(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is beyond a float's range")
    return value


def aware_time(text: Any, field: str) -> dt.datetime:
    """A time the pack states, ISO 8601 with its UTC offset as the writer writes every one;
    ``ValueError`` naming ``field`` for anything else, a time without an offset too: read in
    the auditor's local time, it would be another moment on each machine."""
    try:
        moment = dt.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise ValueError(f"{field} {text!r} is not an ISO 8601 time") from None
    if moment.utcoffset() is None:
        raise ValueError(f"{field} {text!r} has no UTC offset")
    return moment


def whole_number(value: Any) -> bool:
    """An integer as the writer writes one: Python's bool is an int too, a float is not."""
    return isinstance(value, int) and not isinstance(value, bool)
