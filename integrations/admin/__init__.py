"""Django admin for staff: one module per model group."""

from integrations.admin import (  # noqa: F401  (registers the admins)
    brokers,
    consumers,
    drop,
    integrations,
    keys,
    ledger,
    reports,
    requests,
    staff,
)
