"""A directive's format: the CSV a service provider or contractor gets and its signature.

The CSV is ``hash_type,hash``, one row per DROP hash (Base64, as DROP sent it), sorted, so
the provider matches exactly as the broker did; the signature is detached: Ed25519 over the
CSV's exact bytes, in Base64 on one line, as an evidence pack's ``manifest.sig``::

    content = directive_csv([("email", "q2Z..."), ("phone", "Xk1...")])
    signature = directive_sign(key, content)              # the .sig file's bytes
    directive_verify(public_key, content, signature)      # raises InvalidSignature

No Django and no database, like ``pack``: a provider checks a directive with the public key
(``evidence public-key``) and this module, or any Ed25519 tool.
"""

from __future__ import annotations

from collections.abc import Iterable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from integrations.evidence import pack

HEADER = b"hash_type,hash\n"


def directive_csv(rows: Iterable[tuple[str, str]]) -> bytes:
    """The CSV of ``(hash_type, Base64 hash)`` rows, in the order given (neither value ever
    needs quoting: list type names and Base64)."""
    return HEADER + b"".join(f"{hash_type},{value}\n".encode("ascii") for hash_type, value in rows)


def directive_sign(key: Ed25519PrivateKey, content: bytes) -> bytes:
    return pack.sign_manifest(key, content)


def directive_verify(key: Ed25519PublicKey, content: bytes, signature_file: bytes) -> None:
    """Raise ``InvalidSignature`` (or ``ValueError``) unless the signature holds."""
    pack.verify_manifest(key, content, signature_file)
