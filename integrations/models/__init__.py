"""dropportal's models, one module per domain."""

from integrations.models.admin_sessions import AdminSession
from integrations.models.alerts import AlertState
from integrations.models.brokers import Broker, BrokerMode, ListSelection
from integrations.models.canaries import CANARY_SESSION_ID, Canary, CanaryRound
from integrations.models.consumers import Consumer, ConsumerHash
from integrations.models.drop import (
    HASH_TYPE_CHOICES,
    CycleState,
    DropCycle,
    OutstandingCycle,
    UnreadableWorkItem,
    WorkItem,
    WorkItemQuerySet,
    WorkItemState,
    cycle_may_have_outstanding,
    no_status_held,
    owed_status,
)
from integrations.models.drop_access import DropAccessObligation, DropOutage
from integrations.models.drop_notifications import DropNotification
from integrations.models.encryption import EncryptionCanary
from integrations.models.integrations import (
    DROP_CAPABILITIES,
    Integration,
    IntegrationKind,
    IsiAuth,
    IsiConnection,
    IsiIntegration,
    OfItsKind,
    SaasConnection,
    WebhookIntegration,
)
from integrations.models.keys import ApiKey, ApiKeyScope
from integrations.models.ledger import LedgerAnchor, LedgerChainLink, LedgerEvent
from integrations.models.providers import Directive, DirectiveReason, ServiceProvider
from integrations.models.recurring import RecurringCounts
from integrations.models.reports import (
    AWAITING_DROP,
    NOT_YET_TAKEN,
    ReportFile,
    ReportFileState,
    ReportKind,
)
from integrations.models.requests import (
    DROP_STATUS_ALL_CANCELLED,
    DROP_STATUS_CODES,
    DROP_STATUS_PRECEDENCE,
    OUTCOME_REFUSING_STATES,
    OUTCOMES_NOT_FINAL,
    DeletionRequest,
    DeliveryAttempt,
    DropOutcome,
    OptOutRecord,
    RequestState,
    ResolutionRequest,
    SaasDeletion,
)
from integrations.models.shown_once import SHOWN_ONCE_TTL, ShownOnceSecret
from integrations.models.staff_mfa import StaffRecoveryCodes, StaffTotpDevice
from integrations.models.staff_oidc import StaffOidcIdentity
from integrations.models.suppression import Reappearance

__all__ = [
    "AWAITING_DROP",
    "CANARY_SESSION_ID",
    "DROP_CAPABILITIES",
    "DROP_STATUS_ALL_CANCELLED",
    "DROP_STATUS_CODES",
    "DROP_STATUS_PRECEDENCE",
    "HASH_TYPE_CHOICES",
    "NOT_YET_TAKEN",
    "OUTCOMES_NOT_FINAL",
    "OUTCOME_REFUSING_STATES",
    "SHOWN_ONCE_TTL",
    "AdminSession",
    "AlertState",
    "ApiKey",
    "ApiKeyScope",
    "Broker",
    "BrokerMode",
    "Canary",
    "CanaryRound",
    "Consumer",
    "ConsumerHash",
    "CycleState",
    "DeletionRequest",
    "DeliveryAttempt",
    "Directive",
    "DirectiveReason",
    "DropAccessObligation",
    "DropCycle",
    "DropNotification",
    "DropOutage",
    "DropOutcome",
    "EncryptionCanary",
    "Integration",
    "IntegrationKind",
    "IsiAuth",
    "IsiConnection",
    "IsiIntegration",
    "LedgerAnchor",
    "LedgerChainLink",
    "LedgerEvent",
    "ListSelection",
    "OfItsKind",
    "OptOutRecord",
    "OutstandingCycle",
    "Reappearance",
    "RecurringCounts",
    "ReportFile",
    "ReportFileState",
    "ReportKind",
    "RequestState",
    "ResolutionRequest",
    "SaasConnection",
    "SaasDeletion",
    "ServiceProvider",
    "ShownOnceSecret",
    "StaffOidcIdentity",
    "StaffRecoveryCodes",
    "StaffTotpDevice",
    "UnreadableWorkItem",
    "WebhookIntegration",
    "WorkItem",
    "WorkItemQuerySet",
    "WorkItemState",
    "cycle_may_have_outstanding",
    "no_status_held",
    "owed_status",
]
