"""StagedBatches: the batches' first lines and run-on pointers, cut into rounds, and
whether the call's pointers ascend (no database)."""

from __future__ import annotations

from collections.abc import Sequence

from integrations.consumers.load import StagedBatches
from integrations.consumers.readers import ConsumerRecord
from integrations.consumers.workers import EncodedBatch, encode_batch


def batch(*keys: str, kinds: Sequence[str | None] = ()) -> EncodedBatch:
    kinds = kinds or [None] * len(keys)
    return encode_batch(
        ConsumerRecord(n, key, kind, (("email", bytes([n]) * 32),))
        for n, (key, kind) in enumerate(zip(keys, kinds, strict=True))
    )


def test_a_pointer_that_runs_on_into_the_next_batch_is_skipped_there() -> None:
    batches = StagedBatches()
    for keys in (["A", "B"], ["B", "C"], ["C", "C"], [], ["D"]):
        batches.add(batch(*keys))

    round_ = batches.round(b"rows")

    # A batch that starts with the previous batch's last pointer skips its pointer 0 when
    # each pointer's first row is taken (B, then C twice); D is new.
    assert round_.skips == [0, 1, 1, 0]
    assert round_.starts == [1, 3, 5, 7]  # staging lines: two, two, two, then one
    assert round_.copy_data == b"rows"
    assert round_.ascending


def test_rounds_carry_their_own_batches_and_a_pointer_runs_on_across_two() -> None:
    batches = StagedBatches()
    batches.add(batch("A", "B"))
    first = batches.round(b"")
    batches.add(batch("B", "C"))  # B's first row was staged by the round before
    second = batches.round(b"")

    assert (first.starts, first.skips) == ([1], [0])
    assert (second.starts, second.skips) == ([3], [1])


def test_keys_out_of_order_within_or_between_batches_say_so_from_then_on() -> None:
    within = StagedBatches()
    within.add(batch("B", "A"))
    assert not within.round(b"").ascending
    between = StagedBatches()
    between.add(batch("A", "C"))
    assert between.round(b"").ascending
    between.add(batch("B"))
    assert not between.round(b"").ascending
    between.add(batch("X", "Y"))  # in order itself, but the call is not
    assert not between.round(b"").ascending


def test_a_kind_named_after_a_batch_boundary_is_kept_for_the_pointer_that_ran_on() -> None:
    batches = StagedBatches()
    batches.add(batch("A", "B", kinds=[None, "vin"]))
    batches.add(batch("B", "C"))  # B runs on and names nothing: vin stays
    batches.add(batch("C", "D", kinds=["account_id", None]))
    batches.add(batch("D"))
    batches.add(batch("D", kinds=["device_id"]))
    batches.add(batch("D", "E", kinds=["maid_kind", None]))

    # Only a kind named in a later batch is kept here (a pointer's own batch puts it on
    # the pointer's first row); the last one wins.
    round_ = batches.round(b"")
    assert round_.kinds == {"C": "account_id", "D": "maid_kind"}
    assert round_.kinds_given
    batches.add(batch("E", "F"))
    assert (batches.round(b"").kinds, batches.kinds_given) == ({}, False)
