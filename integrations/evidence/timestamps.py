"""RFC 3161 time-stamp tokens over the ledger's chain hashes: the request, and the checks of
an answer, shared by the service that anchors the chain (``services.ledger_anchors``), its
``ledger verify`` and the offline pack verifier (no Django, no database)::

    request = timestamp_request(chain_hash)          # TimeStampReq, DER: request.as_bytes()
    problem = token_problem(tsr_der, chain_hash, nonce=request.nonce)   # None: it covers it
    problem = token_chain_problem(tsr_der, chain_hash, load_certificates(ca_pem))

The message an authority timestamps is the chain hash as the ledger writes it: its 64 hex
characters, in ASCII. The token's message imprint is their SHA-256, so anyone can check a
token with OpenSSL alone (``printf %s HASH > head; openssl ts -verify -data head -in
TOKEN.tsr -CAfile ca.pem``). The protocol itself is ``rfc3161-client``'s.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re

from cryptography import x509
from rfc3161_client import (
    HashAlgorithm,
    PKIStatus,
    TimeStampRequest,
    TimestampRequestBuilder,
    TimeStampResponse,
    VerificationError,
    VerifierBuilder,
    decode_timestamp_response,
)

CONTENT_TYPE_QUERY = "application/timestamp-query"
CONTENT_TYPE_REPLY = "application/timestamp-reply"
SHA256_OID = x509.ObjectIdentifier("2.16.840.1.101.3.4.2.1")


def anchored_message(chain_hash: str) -> bytes:
    """What a token timestamps: the chain hash's hex text."""
    return chain_hash.encode("ascii")


def timestamp_request(chain_hash: str) -> TimeStampRequest:
    """A SHA-256 request over ``chain_hash``, with a nonce, asking for the signer's
    certificate in the answer (so a verifier needs only the authority's CA)."""
    return (
        TimestampRequestBuilder()
        .data(anchored_message(chain_hash))
        .hash_algorithm(HashAlgorithm.SHA256)
        .nonce(nonce=True)
        .cert_request(cert_request=True)
        .build()
    )


def token_read(tsr_der: bytes) -> TimeStampResponse:
    """The authority's answer, parsed; ``ValueError`` naming why it is not one."""
    try:
        return decode_timestamp_response(tsr_der)
    except ValueError as exc:
        raise ValueError(f"not an RFC 3161 time-stamp response: {exc}") from None


def token_gen_time(tsr_der: bytes) -> dt.datetime:
    """When the authority says it timestamped (UTC)."""
    gen_time = token_read(tsr_der).tst_info.gen_time
    return gen_time if gen_time.tzinfo else gen_time.replace(tzinfo=dt.UTC)


def token_problem(tsr_der: bytes, chain_hash: str, *, nonce: int | None = None) -> str | None:
    """Why ``tsr_der`` is not a granted token over ``chain_hash`` (None when it is): it
    parses, the authority granted it, its imprint is SHA-256 of the chain hash, and with
    ``nonce`` it answers that request. The signature is ``token_chain_problem``'s."""
    try:
        response = token_read(tsr_der)
    except ValueError as exc:
        return str(exc)
    if response.status != PKIStatus.GRANTED:
        detail = "; ".join(response.status_string) or f"status {response.status}"
        return f"the authority refused to timestamp: {detail}"
    imprint = response.tst_info.message_imprint
    if imprint.hash_algorithm != SHA256_OID:
        return f"its message imprint is not SHA-256 ({imprint.hash_algorithm.dotted_string})"
    if imprint.message != hashlib.sha256(anchored_message(chain_hash)).digest():
        return f"it covers another chain head, not {chain_hash}"
    if nonce is not None and response.tst_info.nonce != nonce:
        return "its nonce is not the request's"
    return None


def token_chain_problem(
    tsr_der: bytes, chain_hash: str, authorities: list[x509.Certificate]
) -> str | None:
    """``token_problem``, then the signature: made by a certificate for time-stamping
    (extendedKeyUsage critical timeStamping) that chains to one of ``authorities``, valid
    at the token's time. None when all of it holds."""
    problem = token_problem(tsr_der, chain_hash)
    if problem is not None:
        return problem
    builder = VerifierBuilder()
    for certificate in authorities:
        builder = builder.add_root_certificate(certificate)
    try:
        builder.build().verify_message(token_read(tsr_der), anchored_message(chain_hash))
    except (VerificationError, ValueError) as exc:
        # OpenSSL's error stack is long; its verify error is the part a person can act on.
        found = re.search(r'Verify error: ([^"]+)', str(exc))
        reason = found.group(1) if found else str(exc)[:200]
        return f"its signature does not chain to the given certificate ({reason})"
    return None


def load_certificates(pem: bytes) -> list[x509.Certificate]:
    """Every certificate in a PEM file (or one DER certificate); ``ValueError`` if none."""
    try:
        if b"-----BEGIN" in pem:
            certificates = x509.load_pem_x509_certificates(pem)
        else:
            certificates = [x509.load_der_x509_certificate(pem)]
    except ValueError as exc:
        raise ValueError(f"not a certificate: {exc}") from None
    return certificates
