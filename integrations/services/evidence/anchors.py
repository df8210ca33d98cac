"""The time-stamp tokens of an evidence pack's ledger range: each RFC 3161 token kept for a
chain position inside the range (``services.ledger_anchors``), as the authority sent it, and
``anchors.json`` listing what each covers::

    write_anchors(writer, span)     # after ledger.jsonl, in the pack's snapshot

    anchors/<position>.tsr   the authority's TimeStampResp (DER), exactly as received
    anchors.json             {"format": ..., "anchors": [{"position", "event_id",
                              "chain_hash", "token", "token_sha256", "gen_time", "tsa_url"}]}

The offline verifier (``integrations.evidence.timestamps``) holds each token to the chain
hash it recomputes at that position, and every field of its entry but ``tsa_url`` to the
ledger line there and to the token. Nothing is written when no token falls in the range.
"""

from __future__ import annotations

from collections import Counter

from integrations.evidence import timestamps
from integrations.ledger_hash import canonical_json
from integrations.models import LedgerAnchor
from integrations.services.evidence.evidence_ledger import LedgerRange
from integrations.services.evidence.evidence_writer import PackWriter


def write_anchors(writer: PackWriter, span: LedgerRange) -> int:
    """Write the range's tokens and their list; return how many."""
    if span.first is None or span.last is None:
        return 0
    anchors = LedgerAnchor.objects.filter(position__range=(span.first, span.last)).order_by(
        "position", "id"
    )
    listed = []
    seen: Counter[int] = Counter()
    for anchor in anchors.iterator():
        seen[anchor.position] += 1
        # Two anchorings can meet the same head (a job and a command at once).
        suffix = "" if seen[anchor.position] == 1 else f"-{seen[anchor.position]}"
        name = f"{timestamps.PACK_DIR}{anchor.position}{suffix}.tsr"
        writer.write(
            name,
            [bytes(anchor.token)],
            rows=None,
            description=f"RFC 3161 time-stamp token over the chain hash at position "
            f"{anchor.position} (DER, as the authority sent it)",
        )
        listed.append(
            {
                "position": anchor.position,
                "event_id": anchor.event_id,
                "chain_hash": anchor.chain_hash,
                "token": name,
                "token_sha256": anchor.token_sha256,
                "gen_time": anchor.gen_time.isoformat(),
                "tsa_url": anchor.tsa_url,
            }
        )
    if listed:
        document = {"format": timestamps.PACK_FORMAT, "anchors": listed}
        writer.write(
            timestamps.PACK_LIST,
            [canonical_json(document).encode() + b"\n"],
            rows=len(listed),
            description="the time-stamp tokens: the position, event and chain hash each covers",
        )
    return len(listed)
