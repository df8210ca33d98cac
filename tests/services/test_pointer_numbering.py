"""PointerNumbering: batches' own pointer numbers made the call's, a pointer that runs on
from one batch into the next keeping one number (no database)."""

from __future__ import annotations

from collections.abc import Sequence

from integrations.drop.registration import ConsumerRecord
from integrations.drop.registration_workers import EncodedBatch, encode_batch
from integrations.services.consumer_merge import PointerNumbering


def batch(*keys: str, kinds: Sequence[str | None] = ()) -> EncodedBatch:
    kinds = kinds or [None] * len(keys)
    return encode_batch(
        ConsumerRecord(n, key, kind, (("email", bytes([n]) * 32),))
        for n, (key, kind) in enumerate(zip(keys, kinds, strict=True))
    )


def test_batches_number_the_calls_pointers_once_each() -> None:
    numbering = PointerNumbering()
    for keys in (["A", "B"], ["B", "C"], ["C", "C"], [], ["D"]):
        numbering.add(batch(*keys))

    # A=0, B=1, C=2, D=3: a batch's pointer n is offsets[batch] + n; a batch that starts
    # with the previous batch's last pointer skips its pointer 0 when pointers are drawn.
    assert numbering.offsets == [0, 1, 2, 3]
    assert numbering.skips == [0, 1, 1, 0]
    assert numbering.starts == [1, 3, 5, 7]  # staging lines: two, two, two, then one
    assert numbering.pointers == 4
    assert numbering.ascending


def test_keys_out_of_order_within_or_between_batches_turn_numbering_off() -> None:
    within = PointerNumbering()
    within.add(batch("B", "A"))
    assert not within.ascending
    between = PointerNumbering()
    between.add(batch("A", "C"))
    between.add(batch("B"))
    assert not between.ascending


def test_a_kind_named_after_a_batch_boundary_is_kept_for_the_pointer_that_ran_on() -> None:
    numbering = PointerNumbering()
    numbering.add(batch("A", "B", kinds=[None, "vin"]))
    numbering.add(batch("B", "C"))  # B runs on and names nothing: vin stays
    numbering.add(batch("C", "D", kinds=["account_id", None]))
    numbering.add(batch("D"))
    numbering.add(batch("D", kinds=["device_id"]))
    numbering.add(batch("D", "E", kinds=["maid_kind", None]))

    # Pointer numbers A=0, B=1, C=2, D=3: only a kind named in a later batch is kept here
    # (a pointer's own batch puts it on the pointer's first row); the last one wins.
    assert numbering.kinds == {2: "account_id", 3: "maid_kind"}
    assert numbering.pointers == 5
