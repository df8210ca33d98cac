"""Every kind of ledger event, in one registry: ``services.ledger`` refuses any other.

A member's value is the string stored in ``LedgerEvent.kind`` and covered by the event's
hash, so a value never changes once events carry it (the ledger is append-only): a new
meaning is a new member. The SQL write paths (``integrations/sql/*.sql``) write their kinds
as literals; tests/test_ledger_kinds.py holds those to this registry too.

A leaf module (standard library only): models, services, SQL tests and the offline evidence
verifier all import it.
"""

from __future__ import annotations

from enum import StrEnum


class LedgerKind(StrEnum):
    # -- brokers, their keys and secrets
    BROKER_CREATED = "broker.created"  # a broker and its settings
    BROKER_UPDATED = "broker.updated"  # changed broker settings (a key only as changed or cleared)
    API_KEY_CREATED = "api_key.created"  # an API key issued (its prefix and scopes)
    API_KEY_REVOKED = "api_key.revoked"  # an API key revoked
    SECRETS_REENCRYPTED = "secrets.reencrypted"  # stored secrets re-encrypted under the new key
    # the lists staff say the broker selected in DROP's portal, from when, and why
    BROKER_LISTS_SELECTED = "broker.lists_selected"

    # -- DROP: pulling, importing and matching a cycle
    DROP_API_CALL = "drop.api_call"  # one call to DROP's API and its outcome
    DROP_PULLED = "drop.pulled"  # a pull that succeeded: nothing new, imported or already imported
    DROP_PULL_FAILED = "drop.pull_failed"  # a pull that failed (raises drop_unreachable)
    DROP_IMPORT_REFUSED = "drop.import_refused"  # a DROP package refused on import
    DROP_CYCLE_IMPORTED = "drop.cycle_imported"  # a cycle's work items imported and matched
    # members of a DROP package that are not DROP lists (a README, a folder entry), skipped
    DROP_PACKAGE_MEMBERS_SKIPPED = "drop.package_members_skipped"
    DROP_WORK_ITEMS_REMOVED = "drop.work_items_removed"  # DROP's removed items closed
    DROP_LATE_MATCHED = "drop.late_matched"  # open work items matched by consumers added later
    DROP_DOCTOR_CHECKED = "drop.doctor_checked"  # a ``drop doctor`` run and what it found
    DROP_CYCLE_REPORTED = "drop_cycle.reported"  # a cycle with every status reported to DROP
    # DROP holds a status for everything a cycle owes, and a file of it (an amendment) is not
    # yet taken: the cycle stays open for that file; its deadline is judged by this moment
    DROP_CYCLE_STATUSES_HELD = "drop_cycle.statuses_held"
    DROP_NOTIFICATION_RECEIVED = "drop.notification_received"  # DROP's webhook: one event
    # one that came while a file of its kind was being sent, attached once DROP's answer was in
    DROP_NOTIFICATION_ATTACHED = "drop.notification_attached"
    # -- DROP access: outages of the automated connection and the notice a long one obliges
    DROP_OUTAGE_STARTED = "drop.outage_started"  # a DROP call failed, not the broker's doing
    DROP_OUTAGE_ENDED = "drop.outage_ended"  # DROP answered again (how long it lasted)
    DROP_ACCESS_OBLIGATION_CREATED = "drop.access_obligation_created"  # out more than a day
    DROP_ACCESS_NOTICE_RECORDED = "drop.access_notice_recorded"  # notice to CalPrivacy, by staff

    # -- work items and consumers
    WORK_ITEM_STATUS_SET = "work_item.status_set"  # a status set by hand or by a service
    WORK_ITEM_STATUS_SETTLED = "work_item.status_settled"  # a status settled by outcomes (SQL)
    CONSUMERS_REGISTERED = "consumers.registered"  # a batch of consumers registered
    CONSUMER_FORGOTTEN = "consumer.forgotten"  # a consumer's identifiers erased
    # a full file replaced the broker's set of a kind: how many consumers it forgot (no values)
    CONSUMERS_REPLACED = "consumers.replaced"

    # -- suppression and reappearances (the continuing duty)
    # a registration brought back consumers whose suppressed hash was already matched
    CONSUMERS_REAPPEARED = "consumers.reappeared"
    SUPPRESSION_CHECKED = "suppression.checked"  # a suppression check: counts only, no hash
    SUPPRESSION_EXPORTED = "suppression.exported"  # the suppressed hashes exported (counts)

    # -- deletion requests (the delivery loop composes its events: ledger_kind_compose)
    DELETION_REQUESTS_CREATED = "deletion_requests.created"  # requests created for matches
    PENDING_REQUESTS_TARGETED = "pending_requests.targeted"  # pending requests given targets
    DELETION_REQUEST_DELIVERED = "deletion_request.delivered"  # acknowledged by its target
    DELETION_REQUEST_DELIVERY_FAILED = "deletion_request.delivery_failed"  # an attempt failed
    DELETION_REQUEST_UNDELIVERABLE = "deletion_request.undeliverable"  # retries used up
    DELETION_REQUEST_CANCELLED = "deletion_request.cancelled"  # cancelled by the delivery loop
    DELETION_REQUEST_OUTCOME_RECORDED = "deletion_request.outcome_recorded"  # its outcome (SQL)
    DELETION_REQUEST_OUTCOME_REPEATED = "deletion_request.outcome_repeated"  # same outcome again
    DELETION_REQUEST_REDELIVERY_REQUESTED = "deletion_request.redelivery_requested"  # by staff
    DELETION_REQUEST_REDISPATCHED = "deletion_request.redispatched"  # sent again, no outcome yet

    # -- recurring deletion (Civil Code 1798.99.86(d))
    # the rounds due of deleted and opted-out consumers sent: counts, the days ahead asked
    RECURRING_ROUNDS_SENT = "recurring.rounds_sent"

    # -- canaries: consumers the broker keeps for testing its deletion system
    CANARY_ADDED = "canary.added"  # a registered consumer named a canary by staff
    CANARY_REMOVED = "canary.removed"  # no longer a canary (the consumer stays registered)
    # a canary round: each canary's deletion request to every target (drop_session_id "0")
    CANARY_ROUND_SENT = "canary.round_sent"

    # -- resolution requests (ISI) and the SaaS deletions they lead to
    RESOLUTION_REQUEST_DELIVERED = "resolution_request.delivered"  # acknowledged by the ISI
    RESOLUTION_REQUEST_DELIVERY_FAILED = "resolution_request.delivery_failed"  # attempt failed
    RESOLUTION_REQUEST_UNDELIVERABLE = "resolution_request.undeliverable"  # retries used up
    RESOLUTION_REQUEST_CANCELLED = "resolution_request.cancelled"  # cancelled by the loop
    RESOLUTION_REQUEST_OUTCOME_RECORDED = "resolution_request.outcome_recorded"  # its answer
    RESOLUTION_REQUEST_OUTCOME_REPEATED = "resolution_request.outcome_repeated"  # same answer
    # its identifiers erased once every SaaS deletion it led to is final
    RESOLUTION_REQUEST_IDENTIFIERS_PURGED = "resolution_request.identifiers_purged"
    RESOLUTION_REQUEST_REDELIVERY_REQUESTED = "resolution_request.redelivery_requested"  # staff
    SAAS_DELETION_DELIVERED = "saas_deletion.delivered"  # done by the SaaS connection
    SAAS_DELETION_DELIVERY_FAILED = "saas_deletion.delivery_failed"  # an attempt failed
    SAAS_DELETION_UNDELIVERABLE = "saas_deletion.undeliverable"  # retries used up
    SAAS_DELETION_CANCELLED = "saas_deletion.cancelled"  # cancelled (by staff or nothing to send)
    SAAS_DELETION_REDELIVERY_REQUESTED = "saas_deletion.redelivery_requested"  # by staff

    # -- integrations (webhook, ISI) and SaaS connections
    INTEGRATION_CREATED = "integration.created"  # a webhook or ISI integration added
    INTEGRATION_UPDATED = "integration.updated"  # its settings changed
    # its signing secret replaced
    INTEGRATION_SECRET_ROTATED = "integration.secret_rotated"  # noqa: S105 (a kind, not a secret)
    INTEGRATION_DISABLED = "integration.disabled"  # disabled by staff or by a 410 Gone
    INTEGRATION_ENABLED = "integration.enabled"  # enabled again (its rows queued again)
    # ended for good: its open requests cancelled, their work items settled
    INTEGRATION_RETIRED = "integration.retired"
    INTEGRATION_TEST_SENT = "integration.test_sent"  # a test call and its result
    ISI_CONNECTIONS_REFRESHED = "isi.connections_refreshed"  # an ISI's SaaS connections read
    ISI_CONNECTIONS_REFRESH_FAILED = "isi.connections_refresh_failed"  # reading them failed
    SAAS_CONNECTION_CREATED = "saas_connection.created"  # a SaaS connection added
    SAAS_CONNECTION_UPDATED = "saas_connection.updated"  # its settings changed
    SAAS_CONNECTION_DISABLED = "saas_connection.disabled"  # disabled by staff or by a 410 Gone
    SAAS_CONNECTION_ENABLED = "saas_connection.enabled"  # enabled again
    SAAS_CONNECTION_RETIRED = "saas_connection.retired"  # ended for good, open deletions cancelled
    CALLBACK_REJECTED = "callback.rejected"  # a callback with a valid API key refused

    # -- service providers and contractors, and the directives they get
    SERVICE_PROVIDER_ADDED = "service_provider.added"  # registered for a broker
    SERVICE_PROVIDER_UPDATED = "service_provider.updated"  # its contact or S3 prefix changed
    DIRECTIVE_ISSUED = "directive.issued"  # a signed directive (its digest and counts)
    DIRECTIVE_DELIVERED = "directive.delivered"  # written to the provider's S3 prefix
    DIRECTIVE_DELIVERY_FAILED = "directive.delivery_failed"  # writing it there failed
    DIRECTIVE_WRITE_QUEUED = "directive.write_queued"  # staff queued its S3 write again
    DIRECTIVE_DOWNLOADED = "directive.downloaded"  # its CSV and signature taken by staff
    DIRECTIVE_ACKNOWLEDGED = "directive.acknowledged"  # by staff or by the provider's key

    # -- report files sent to DROP
    REPORT_FILE_WRITTEN = "report_file.written"  # a status file written (its digest and rows)
    REPORT_FILE_UPLOAD_FAILED = "report_file.upload_failed"  # an upload that failed
    REPORT_FILE_ACCEPTED = "report_file.accepted"  # DROP accepted it
    REPORT_FILE_REJECTED = "report_file.rejected"  # DROP rejected it
    REPORT_FILE_MARKED_UPLOADED = "report_file.marked_uploaded"  # staff uploaded it by hand
    REPORT_FILE_REFUSED = "report_file.refused"  # DROP refused it alone (409): sent again
    REPORT_FILE_DISCARDED = "report_file.discarded"  # staff gave up an amendment, with a reason
    # "approve uploads": a file waits for a second person, who approves or rejects it
    REPORT_FILE_AWAITING_APPROVAL = "report_file.awaiting_approval"  # written, not sent yet
    REPORT_FILE_APPROVED = "report_file.approved"  # approved by another person: to be uploaded
    # Not "report_file.rejected", which is DROP's rejection: this one never reached DROP.
    REPORT_FILE_APPROVAL_REJECTED = "report_file.approval_rejected"  # not approved, with a reason

    # -- staff (the admin composes its events: ledger_kind_compose)
    # A staff account added in the admin, or at its first sign-in through the provider.
    STAFF_USER_ADDED = "staff_user.added"
    STAFF_USER_CHANGED = "staff_user.changed"  # a staff account changed in the admin
    STAFF_USER_DELETED = "staff_user.deleted"  # a staff account deleted in the admin
    STAFF_USER_MFA_ENROLLED = "staff_user.mfa_enrolled"  # two-factor authentication set up
    STAFF_USER_MFA_RECOVERY_CODES_RENEWED = "staff_user.mfa_recovery_codes_renewed"  # new codes
    STAFF_USER_MFA_RESET = "staff_user.mfa_reset"  # two-factor authentication reset
    # a wrong code at the second step (its factor, the failures in a row): throttled tries,
    # refused before any code is checked, are not events
    STAFF_USER_MFA_FAILED = "staff_user.mfa_failed"
    STAFF_USER_PASSWORD_RESET = "staff_user.password_reset"  # noqa: S105  (set by a superuser)
    # changed by the member themselves, the old one given again (never a password or its hash)
    STAFF_USER_PASSWORD_CHANGED = "staff_user.password_changed"  # noqa: S105  (a kind)
    STAFF_USER_SIGNED_IN = "staff_user.signed_in"  # by password or the identity provider
    STAFF_USER_SIGN_IN_REFUSED = "staff_user.sign_in_refused"  # with the reason, never a token
    STAFF_USER_ROLES_CHANGED = "staff_user.roles_changed"  # the identity provider's claim
    # `staff deactivate`, or Active unticked in the admin: sessions ended
    STAFF_USER_DEACTIVATED = "staff_user.deactivated"
    GROUP_ADDED = "group.added"  # a role group added in the admin
    GROUP_CHANGED = "group.changed"  # a role group's permissions or members changed
    GROUP_DELETED = "group.deleted"  # a role group deleted in the admin

    # -- exports, the ledger itself, alerts and jobs
    OUTCOMES_EXPORTED = "outcomes.exported"  # an outcomes export (who, which filters)
    LEDGER_EXPORTED = "ledger.exported"  # a ledger export (who, which filters)
    REPORT_FILES_EXPORTED = "report_files.exported"  # a cycle's report files downloaded
    EVIDENCE_EXPORTED = "evidence.exported"  # an evidence pack exported (its manifest's digest)
    LEDGER_VERIFIED = "ledger.verified"  # a ``ledger verify`` run and its result
    # the chain head timestamped by an RFC 3161 authority: position, chain hash, token digest
    LEDGER_ANCHORED = "ledger.anchored"
    LEDGER_ANCHOR_FAILED = "ledger.anchor_failed"  # the authority could not be asked or refused
    # the nightly check of every kept token against the chain, and what did not hold
    LEDGER_ANCHORS_VERIFIED = "ledger.anchors_verified"
    ALERT_RAISED = "alert.raised"  # an alert condition began
    ALERT_CLEARED = "alert.cleared"  # an alert condition ended
    JOB_STALLED_RETRIED = "job.stalled_retried"  # a job of a lost worker retried
    # a superuser's change to the service's machinery in the admin: login lockouts (django-axes)
    # deleted or cleaned up, jobs (Procrastinate) retried, cancelled or aborted
    MACHINERY_CHANGED = "machinery.changed"


def ledger_kind_check(kind: str) -> LedgerKind:
    """``kind`` as its registered member; a ValueError naming it if it is not registered."""
    try:
        return LedgerKind(kind)
    except ValueError:
        raise ValueError(
            f"unknown ledger kind {kind!r}: every kind is a member of LedgerKind "
            "(integrations/ledger_kinds.py)"
        ) from None


def ledger_kind_compose(prefix: str, verb: str) -> LedgerKind:
    """The kind ``<prefix>.<verb>`` of a family composed at run time: the delivery loop's
    (``DeliveryKind.name`` and its outcome, ``deletion_request.delivered``) and the staff
    admin's (``staff_user.added``). A ValueError if the pair is not registered."""
    return ledger_kind_check(f"{prefix}.{verb}")
