"""RFC 3161 time-stamp tokens over the ledger's chain hashes: the request, and the checks of
an answer, shared by the service that anchors the chain (``services.ledger_anchors``), its
``ledger verify`` and the offline pack verifier (no Django, no database)::

    request = timestamp_request(chain_hash)          # TimeStampReq, DER: request.as_bytes()
    problem = token_problem(tsr_der, chain_hash, nonce=request.nonce)   # None: it covers it
    problem = token_chain_problem(tsr_der, chain_hash, load_certificates(ca_pem))

An evidence pack carries the tokens of its ledger range (``anchors/<position>.tsr`` and
``anchors.json``); ``PackAnchors`` checks them as the pack verifier recomputes the chain::

    anchors = PackAnchors.read(read_member, names)     # before the ledger pass
    anchors.chain_hash_seen(position, event_id, chain_hash, created_at=shown)  # each link
    line = anchors.check(authorities)                  # after it; raises PackInvalid

The message an authority timestamps is the chain hash as the ledger writes it: its 64 hex
characters, in ASCII. The token's message imprint is their SHA-256, so anyone can check a
token with OpenSSL alone (``printf %s HASH > head; openssl ts -verify -data head -in
TOKEN.tsr -CAfile ca.pem``). The protocol itself is ``rfc3161-client``'s.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from integrations.evidence import pack
from integrations.evidence.archive import PackInvalid

# rfc3161-client is imported where a token is handled, so that a pack without tokens (an
# older one among them) still verifies with ``cryptography`` alone, as auditors install it.
# cryptography's x509 as well: a few hundredths of a second no process's start needs.
if TYPE_CHECKING:
    from cryptography import x509
    from rfc3161_client import TimeStampRequest, TimeStampResponse

CONTENT_TYPE_QUERY = "application/timestamp-query"
CONTENT_TYPE_REPLY = "application/timestamp-reply"
SHA256_OID = "2.16.840.1.101.3.4.2.1"  # its dotted_string
# In an evidence pack.
PACK_DIR = "anchors/"
PACK_LIST = "anchors.json"
PACK_FORMAT = "dropportal-anchors/1"
_TOKEN_MAX = 1 << 20
# The service asks for a token every day (the ``anchor_ledger`` job). With ``--tsa-cert``, the
# last token may precede the range's last event whose time the pack shows by this much at
# most: a day's anchor missed is tolerated, tokens dropped from the pack's end are not.
TOKEN_LAG_TOLERATED = dt.timedelta(days=2)


def anchored_message(chain_hash: str) -> bytes:
    """What a token timestamps: the chain hash's hex text."""
    return chain_hash.encode("ascii")


def timestamp_request(chain_hash: str) -> TimeStampRequest:
    """A SHA-256 request over ``chain_hash``, with a nonce, asking for the signer's
    certificate in the answer (so a verifier needs only the authority's CA)."""
    from rfc3161_client import HashAlgorithm, TimestampRequestBuilder

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
    from rfc3161_client import decode_timestamp_response

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
    from rfc3161_client import PKIStatus

    try:
        response = token_read(tsr_der)
    except ValueError as exc:
        return str(exc)
    if response.status != PKIStatus.GRANTED:
        detail = "; ".join(response.status_string) or f"status {response.status}"
        return f"the authority refused to timestamp: {detail}"
    try:
        # The token's content is parsed as it is read: a time that is no date fails here.
        imprint = response.tst_info.message_imprint
        response.tst_info.gen_time  # noqa: B018  (read for its check)
    except ValueError as exc:
        return f"not an RFC 3161 time-stamp token: {exc}"
    if imprint.hash_algorithm.dotted_string != SHA256_OID:
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
    from rfc3161_client import VerificationError, VerifierBuilder

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
    from cryptography import x509

    try:
        if b"-----BEGIN" in pem:
            certificates = x509.load_pem_x509_certificates(pem)
        else:
            certificates = [x509.load_der_x509_certificate(pem)]
    except ValueError as exc:
        raise ValueError(f"not a certificate: {exc}") from None
    return certificates


class PackAnchors:
    """The tokens an evidence pack lists, held to the chain hashes the verifier recomputes
    from ``ledger.jsonl`` at their positions (so a token over any other head fails, named);
    what ``anchors.json`` says of each (its event, its file's name and SHA-256, its time) is
    held to the ledger and the token too."""

    def __init__(self, listed: list[dict[str, Any]], read_member: Callable[[str, int], bytes]):
        self.listed = listed
        self.read_member = read_member
        self.wanted = {entry["position"] for entry in listed}
        self.seen: dict[int, tuple[int, str]] = {}  # position: its event id, chain hash
        self.last_position = 0  # the range's last chained position
        self.chained = 0  # the range's chained events
        # Those chained after the last token's position: no token in the pack anchors them.
        self.last_wanted = max(self.wanted, default=0)
        self.after_last = 0
        # Of those, the latest whose time the pack shows (the broker's own): its position, time.
        self.latest_after: tuple[int, dt.datetime] | None = None

    @classmethod
    def read(cls, read_member: Callable[[str, int], bytes], names: set[str]) -> PackAnchors:
        """The pack's ``anchors.json`` (none: a pack without tokens, or from before them);
        ``names`` are the pack's members, each ``anchors/`` one must be listed."""
        listed: list[dict[str, Any]] = []
        if PACK_LIST in names:
            try:
                document = pack.json_read(read_member(PACK_LIST, _TOKEN_MAX))
                if document.get("format") != PACK_FORMAT:
                    raise ValueError(f"not a {PACK_FORMAT} list")
                for entry in document["anchors"]:
                    if not pack.whole_number(entry["position"]):
                        raise ValueError(f"the position {entry['position']!r} is not an integer")
                    if not (
                        isinstance(entry["chain_hash"], str) and isinstance(entry["token"], str)
                    ):
                        raise ValueError(f"the entry of position {entry['position']} is incomplete")
                    listed.append(entry)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise PackInvalid(f"{PACK_LIST}: {exc}") from None
        tokens: set[str] = set()
        for entry in listed:
            # The writer writes a file per anchor: one file would stand for two.
            if entry["token"] in tokens:
                raise PackInvalid(f"{PACK_LIST} lists {entry['token']} for two anchors")
            tokens.add(entry["token"])
        for name in sorted(names):
            if name.startswith(PACK_DIR) and name not in tokens:
                raise PackInvalid(f"{name} is a token {PACK_LIST} does not list")
        for name in sorted(tokens - names):
            raise PackInvalid(f"{PACK_LIST} lists {name}, which is not in the pack")
        return cls(listed, read_member)

    def chain_hash_seen(
        self,
        position: int,
        event_id: int,
        chain_hash: str,
        *,
        created_at: dt.datetime | None = None,
    ) -> None:
        """One link recomputed; ``created_at`` when the pack shows the event's time."""
        self.last_position = position
        self.chained += 1
        if position > self.last_wanted:
            self.after_last += 1
            if created_at is not None and (
                self.latest_after is None or created_at > self.latest_after[1]
            ):
                self.latest_after = (position, created_at)
        if position in self.wanted:
            self.seen[position] = (event_id, chain_hash)

    def check(self, authorities: list[x509.Certificate] | None) -> str:
        """Every token against the recomputed chain (and with ``authorities``, its
        signature); the verifier's line for them. ``PackInvalid`` names the first failure."""
        if not self.listed:
            if authorities is not None and self.chained:
                # Asked to check the anchoring, a pack without tokens cannot pass: a key
                # holder who rewrote the chain would simply leave the tokens out.
                raise PackInvalid(
                    f"timestamps: no time-stamp token in the ledger range, which holds "
                    f"{self.chained} chained events: --tsa-cert needs the tokens that anchor "
                    "them"
                )
            return (
                f"timestamps: no time-stamp token in the ledger range (its chain, "
                f"{self.chained} chained events, is anchored nowhere outside the service in "
                "this pack)"
            )
        for entry in self.listed:
            position, name = entry["position"], entry["token"]
            if position not in self.seen:
                raise PackInvalid(f"{name}: position {position} is not in the ledger range")
            event_id, recomputed = self.seen[position]
            if recomputed != entry["chain_hash"]:
                raise PackInvalid(
                    f"{PACK_LIST}: position {position}'s chain hash is not the chain's "
                    f"({recomputed})"
                )
            anchor = f"{PACK_LIST}: the anchor of position {position} ({name})"
            # The writer names each token for its position; -2, -3 for more at one position.
            if not re.fullmatch(rf"{re.escape(PACK_DIR)}{position}(-[0-9]+)?\.tsr", name):
                raise PackInvalid(f"{anchor}: its token is not named for its position")
            listed_event = entry.get("event_id")
            if not pack.whole_number(listed_event) or listed_event != event_id:
                raise PackInvalid(
                    f"{anchor}: event_id {listed_event!r} is not the ledger's ({event_id})"
                )
            token = self.read_member(name, _TOKEN_MAX)
            digest = hashlib.sha256(token).hexdigest()
            if entry.get("token_sha256") != digest:
                raise PackInvalid(f"{anchor}: token_sha256 is not the token's ({digest})")
            problem = (
                token_problem(token, recomputed)
                if authorities is None
                else token_chain_problem(token, recomputed, authorities)
            )
            if problem is not None:
                raise PackInvalid(f"{name} (position {position}): {problem}")
            self.check_gen_time(anchor, entry.get("gen_time"), token)
        positions = sorted(self.wanted)
        covered = (
            f"{len(self.listed)} tokens cover the chain hashes at positions "
            f"{', '.join(str(p) for p in positions[:5])}{', …' if len(positions) > 5 else ''}"
        )
        # How far they reach: a pack whose later tokens were left out shows it here (the
        # service asks for one a day), as the tokens cannot.
        last = max(self.listed, key=lambda entry: entry["position"])
        reached = token_gen_time(self.read_member(last["token"], _TOKEN_MAX))
        covered += f"; the last, position {last['position']}, at {reached.isoformat()}"
        if authorities is not None:
            self.check_reach(last["position"], reached)
        if last["position"] < self.last_position:
            # Not a failure by itself: the service asks for a token a day, so the events
            # since the last one are always unanchored at export; said plainly, counted.
            covered += (
                f", leaves {self.after_last} chained events (positions "
                f"{last['position'] + 1} to {self.last_position}) anchored by no token in "
                "this pack"
            )
        if authorities is None:
            return (
                f"timestamps: {covered}; present but not checked against an authority "
                "(pass --tsa-cert FILE)"
            )
        return f"timestamps: {covered}; each signature chains to the given certificate"

    def check_reach(self, last_position: int, reached: dt.datetime) -> None:
        """Asked to check the anchoring, the tokens must reach to within a missed day's
        anchor of the range's end: a key holder who rewrote the events after one token
        would leave out the later tokens, which the events' own times then show missing."""
        if self.latest_after is None:
            return
        position, written = self.latest_after
        if written - reached <= TOKEN_LAG_TOLERATED:
            return
        raise PackInvalid(
            f"timestamps: the last token (position {last_position}) is of "
            f"{reached.isoformat()}, the event at position {position} was written at "
            f"{written.isoformat()}, {_hours(written - reached)} later: the service asks "
            "the authority for a token every day, so --tsa-cert accepts at most "
            f"{_hours(TOKEN_LAG_TOLERATED)} from the last token to the last event (one day's "
            "anchor missed); the later tokens are missing from the pack, or the service "
            "stopped anchoring"
        )

    @staticmethod
    def check_gen_time(anchor: str, listed: Any, token: bytes) -> None:
        """The time listed is the token's, as the writer writes it (UTC, ``+00:00``)."""
        try:
            pack.aware_time(listed, "gen_time")
        except ValueError as exc:
            raise PackInvalid(f"{anchor}: {exc}") from None
        written = token_gen_time(token).isoformat()
        if listed != written:
            raise PackInvalid(f"{anchor}: gen_time {listed} is not the token's ({written})")


def _hours(span: dt.timedelta) -> str:
    return f"{span.total_seconds() / 3600:.1f} hours"
