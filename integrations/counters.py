"""The process counters behind ``/metrics`` (a leaf: any layer may count without importing
the views)::

    from integrations.counters import DELIVERIES
    DELIVERIES.labels(kind="deletion", result="delivered").inc()
"""

from prometheus_client import Counter

CALLBACKS = Counter(
    "dropportal_callbacks",
    "Broker callbacks answered, by endpoint and HTTP status.",
    ["endpoint", "status"],
)
DELIVERIES = Counter(
    "dropportal_deliveries",
    "Delivery attempts to brokers' systems, by kind and result.",
    ["kind", "result"],
)
DROP_NOTIFICATIONS = Counter(
    "dropportal_drop_notifications",
    "DROP's notifications answered, by result: recorded, duplicate, or the refusal's code.",
    ["result"],
)
