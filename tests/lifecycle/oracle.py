"""The lifecycle model's oracle (``test_lifecycle_model.py``): what should be, written in
plain Python from the rules and not from the services."""

from __future__ import annotations

from dataclasses import dataclass, field

from integrations.drop.standardize import email_hash

BROKER_ID = "4821"
OUTCOMES = ("deleted", "not_found", "opted_out", "exempt", "failed")
# (rank, DROP code): the strongest outcome wins, opted_out (4) over deleted (3) over
# exempt (2) over not_found (5); failed is not final.
STRENGTH = {"opted_out": (4, 4), "deleted": (3, 3), "exempt": (2, 2), "not_found": (1, 5)}
EMAILS = [f"person{n}@example.com" for n in range(6)]
EMAIL_OF_HASH = {email_hash(email): email for email in EMAILS}
POINTERS = [f"C-{n}" for n in range(4)]


@dataclass
class Item:
    work_item_id: str
    hash_b64: str
    session: str
    matched: bool = False
    removed_at_step: int | None = None
    requests: set[str] = field(default_factory=set)  # request uuids the broker received
    # Integrations (uuids, not retired) that were asked to delete its consumers: each owes
    # an answer. Empty with ``waiting``: matched while the broker had no target.
    targets: set[str] = field(default_factory=set)
    waiting: bool = False
    # Recurring deletion: the rounds sent for it, and the request uuids of those rounds the
    # broker received (apart from ``requests``: a round never settles the item).
    rounds: int = 0
    round_requests: set[str] = field(default_factory=set)
    # Reappearances: the pointers of consumers registered after it was matched (each a new
    # match of it: a round-0 request counted like the match's own), and the status it had
    # the last time one came, which its row keeps until an outcome settles it again.
    reappeared_by: list[str] = field(default_factory=list)
    status_at_reappearance: int | None = None


@dataclass
class Request:
    request_uuid: str
    work_item_id: str
    integration_uuid: str
    outcome: str | None = None  # the final one, or "failed"
    failure: str | None = None  # the last failed outcome's message
    email: str = ""
    cancelled: bool = False  # its integration was retired before it was answered
    # Redispatched, and the broker has not had it again since (nor was it redelivered): a
    # failure now answers the dispatch that failed before.
    redispatch_unsent: bool = False

    @property
    def final(self) -> bool:
        """Whether it has a final outcome (failed is not one)."""
        return self.outcome not in (None, "failed")

    def uuid_item_kept(self, oracle: Oracle) -> bool:
        return oracle.items[self.work_item_id].removed_at_step is None


@dataclass
class Oracle:
    """What should be: written from the rules, apart from the services."""

    consumers: dict[str, set[str]] = field(default_factory=dict)  # pointer -> email hashes
    items: dict[str, Item] = field(default_factory=dict)  # by work item id
    by_hash_and_session: dict[tuple[str, str], str] = field(default_factory=dict)
    # In the order the broker first saw them (uuids are random: never sort by them, or an
    # example would pick other requests when Hypothesis runs it again).
    requests: dict[str, Request] = field(default_factory=dict)
    secrets: dict[str, list[str]] = field(default_factory=dict)  # integration uuid -> newest first
    retired: set[str] = field(default_factory=set)  # integration uuids retired
    sessions: int = 0
    reappearances: int = 0  # (work item, consumer) pairs of items matched before

    def active(self) -> list[str]:
        """Integrations that are deletion targets (enabled or disabled, not retired), in the
        order they were added."""
        return [uuid for uuid in self.secrets if uuid not in self.retired]

    def match(self, item: Item) -> None:
        """A consumer matched ``item``: every target is asked (a paused one too)."""
        item.matched = True
        active = self.active()
        item.targets.update(active)
        item.waiting = not item.targets

    def target_added(self, uuid: str) -> None:
        """Matches that waited for a target get it."""
        for item in self.items.values():
            if item.waiting and item.removed_at_step is None:
                item.targets.add(uuid)
                item.waiting = False

    def owes(self, item: Item, uuid: str) -> bool:
        """Whether integration ``uuid`` still owes an answer for ``item``."""
        received = [self.requests[r] for r in item.requests]
        own = [r for r in received if r.integration_uuid == uuid and not r.cancelled]
        return not own or any(not r.final for r in own)

    def retire(self, uuid: str) -> None:
        """Its open requests are cancelled; an item it alone still owed an answer for waits
        for the targets left, or for one when none is left and no request of the item is
        left but cancelled ones (an answer a target gave before it was retired counts).

        The services decide that per match (consumer), this per item: an item with another
        consumer's answer may wait there and not here, which holds back a report the checks
        allow and never writes one they refuse."""
        self.retired.add(uuid)
        for item in self.items.values():
            if uuid not in item.targets:
                continue
            owed = self.owes(item, uuid)
            item.targets.discard(uuid)
            kept = any(
                not request.cancelled and (request.integration_uuid != uuid or request.final)
                for request in (self.requests[r] for r in item.requests)
            )
            if owed and not item.targets and not kept and item.removed_at_step is None:
                self.match(item)
        for request in self.requests.values():
            if request.integration_uuid == uuid and not request.final:
                request.cancelled = True

    def registered_hashes(self) -> set[str]:
        return set().union(*self.consumers.values()) if self.consumers else set()

    def register(self, pointer: str, hash_b64: str) -> tuple[int, list[Item]]:
        """Returns how many kept work items this matches that matched no one before, and
        the kept items matched before that it matches again: its reappearances (none when
        ``pointer`` holds the hash already: the same consumer again is nothing new)."""
        new = hash_b64 not in self.consumers.get(pointer, set())
        self.consumers.setdefault(pointer, set()).add(hash_b64)
        late = 0
        reappeared = []
        # A consumer registered later matches every kept DROP work item with its hash.
        for item in self.items.values():
            if new and item.hash_b64 == hash_b64 and item.removed_at_step is None:
                if item.matched:
                    # Its row keeps this status until an outcome of the new request settles
                    # it (or the last one's, while an earlier reappearance is still open).
                    status = self.expected(item)
                    if status is not None:
                        item.status_at_reappearance = status
                    item.reappeared_by.append(pointer)
                    reappeared.append(item)
                late += not item.matched
                self.match(item)
        self.reappearances += len(reappeared)
        return late, reappeared

    def expected(self, item: Item) -> int | None:
        """The code DROP should get for ``item`` now; None while it has no final status."""
        if not item.matched:
            return 5
        outcomes = [
            self.requests[uuid].outcome
            for uuid in sorted(item.requests)
            if not self.requests[uuid].cancelled
        ]
        if not outcomes or any(o is None or o == "failed" for o in outcomes):
            return None
        return max(STRENGTH[o] for o in outcomes if o)[1]

    def stored_statuses(self, item: Item, *, unreceived: bool = False) -> set[int | None]:
        """The statuses the item's row may have: the one its outcomes give; while a
        reappearance's request is open, also the one it had then (a new request does not
        settle the item, only an outcome does), or none once an outcome of another request
        settled it. ``unreceived``: a request of its match the broker has not received yet
        (a paused target's) is open too."""
        expected = self.expected(item)
        if item.reappeared_by and (expected is None or unreceived):
            return {None, expected, item.status_at_reappearance}
        return {expected}

    def round_may_be_sent(self, item: Item) -> bool:
        """Whether a recurring round may go out for ``item`` now that its interval passed:
        DROP's status is deleted or opted_out, DROP has not removed it, and every round
        request of it the broker received has a final answer (or was cancelled). A
        reappearance's open request (round 0) holds back no round, the first included: the
        status stays the one DROP holds, and the rounds go on."""
        if not item.matched or item.removed_at_step is not None:
            return False
        statuses = self.stored_statuses(item)
        if not statuses & {3, 4}:
            return False
        return all(
            self.requests[uuid].cancelled or self.requests[uuid].final
            for uuid in item.round_requests
        )

    def callback_answer(self, request: Request, outcome: str, error: str) -> str:
        """What recording ``outcome`` should do: "recorded", "unchanged" or "conflict"."""
        if request.cancelled:
            return "conflict"
        if not request.final:
            if outcome == "failed" and request.outcome == "failed" and request.failure == error:
                return "unchanged"
            if outcome == "failed" and request.redispatch_unsent:
                return "unchanged"  # whatever its message: the failure on record is answered
            return "recorded"
        return "unchanged" if request.outcome == outcome else "conflict"
